from django.db import migrations


class Migration(migrations.Migration):
    """The airport world's models now belong to the airport pack (packs/airport), which
    took them over with their tables: they leave this app's state only."""

    dependencies = [
        ("scenarios_admin", "0005_definition_draft"),
        ("airport", "0001_world"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="Flight"),
                migrations.DeleteModel(name="Runway"),
                migrations.DeleteModel(name="TopologyEdge"),
                migrations.DeleteModel(name="TopologyNode"),
                migrations.DeleteModel(name="Topology"),
            ],
            database_operations=[],
        ),
    ]
