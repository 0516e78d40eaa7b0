from typing import Any

from django.db import migrations, models


def backfill_keys(apps: Any, schema_editor: Any) -> None:
    """Events written once by key before the column existed kept the key in the payload."""
    Event = apps.get_model("diagnosis", "Event")
    keyed = Event.objects.filter(
        type__in=["agent.question", "approval.required", "agent.note"], payload__has_key="key"
    )
    for event in keyed.iterator():
        event.key = f"{event.type}:{event.payload['key']}"
        event.save(update_fields=["key"])


class Migration(migrations.Migration):
    dependencies = [
        ("diagnosis", "0002_toolcall_canceled"),
    ]

    operations = [
        migrations.AddField(
            model_name="event",
            name="key",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.RunPython(backfill_keys, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="event",
            constraint=models.UniqueConstraint(
                condition=models.Q(("key", ""), _negated=True),
                fields=("session", "key"),
                name="event_session_key_unique",
            ),
        ),
    ]
