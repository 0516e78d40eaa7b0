from django.db import migrations


class Migration(migrations.Migration):
    """The restrictions in force now belong to the pack whose actions put them in force,
    which took the model over with its table: it leaves this app's state only."""

    dependencies = [
        ("diagnosis", "0012_llmcall_estimated_error_class"),
        ("airport", "0002_restriction"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="restriction", name="restriction_active_idx"),
                migrations.DeleteModel(name="Restriction"),
            ],
            database_operations=[],
        ),
    ]
