import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    """auto_now_add -> default=timezone.now: neither is in the database, so the
    change is Django's state only (SQLite would otherwise rebuild the table)."""

    dependencies = [
        ("diagnosis", "0010_lease_holder"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="agentrun",
                    name="started_at",
                    field=models.DateTimeField(default=django.utils.timezone.now, editable=False),
                ),
            ],
        ),
    ]
