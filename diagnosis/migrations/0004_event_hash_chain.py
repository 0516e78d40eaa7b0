import hashlib
import json
from typing import Any

import django.utils.timezone
from django.db import migrations, models

GENESIS = "0" * 64


def _hash(prev: str, event: Any) -> str:
    # A frozen copy of diagnosis.chain.canonical/link at the time of this migration.
    body = {
        "session": str(event.session_id),
        "seq": event.seq,
        "event_id": str(event.event_id),
        "type": event.type,
        "ts": event.ts.isoformat(),
        "payload": event.payload,
        "producer": event.producer,
        "trace_id": event.trace_id,
        "run": event.run_id,
    }
    data = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(prev.encode("ascii") + data.encode("utf-8")).hexdigest()


def chain_existing_events(apps: Any, schema_editor: Any) -> None:
    """Chain the events written before hashes existed, session by session."""
    Session = apps.get_model("diagnosis", "Session")
    Event = apps.get_model("diagnosis", "Event")
    for session_id in Session.objects.values_list("pk", flat=True).iterator():
        prev = GENESIS
        batch = []
        for event in Event.objects.filter(session_id=session_id).order_by("seq").iterator():
            event.hash = prev = _hash(prev, event)
            batch.append(event)
            if len(batch) >= 1000:
                Event.objects.bulk_update(batch, ["hash"])
                batch = []
        Event.objects.bulk_update(batch, ["hash"])
        Session.objects.filter(pk=session_id).update(chain_head=prev)


class Migration(migrations.Migration):
    dependencies = [
        ("diagnosis", "0003_event_key"),
    ]

    operations = [
        migrations.AddField(
            model_name="event",
            name="hash",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddField(
            model_name="session",
            name="chain_head",
            field=models.CharField(default=GENESIS, max_length=64),
        ),
        migrations.AlterField(
            model_name="event",
            name="ts",
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.RunPython(chain_existing_events, migrations.RunPython.noop),
    ]
