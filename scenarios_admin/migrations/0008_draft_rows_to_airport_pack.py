from django.db import migrations


class Migration(migrations.Migration):
    """The apron draft's own rows (rules, spread radius, actions, examples) now belong to
    the airport pack, which took them over with their tables: they leave this app's state
    only."""

    dependencies = [
        ("scenarios_admin", "0007_field_type_from_packs"),
        ("airport", "0003_draft_rows"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="RiskRule"),
                migrations.DeleteModel(name="SpreadRadius"),
                migrations.DeleteModel(name="ScenarioAction"),
                migrations.DeleteModel(name="ScenarioExample"),
            ],
            database_operations=[],
        ),
    ]
