from django.db import migrations


class Migration(migrations.Migration):
    """The apron's draft settings now live in the airport pack (airport 0004 copied them
    to its ApronDraft rows; reversed, it copies them back into the columns re-added here)."""

    dependencies = [
        ("scenarios_admin", "0008_draft_rows_to_airport_pack"),
        ("airport", "0004_apron_draft"),
    ]

    operations = [
        migrations.RemoveField(model_name="scenario", name="impact_start"),
        migrations.RemoveField(model_name="scenario", name="radius_key"),
        migrations.RemoveField(model_name="scenario", name="default_radius"),
        migrations.RemoveField(model_name="scenario", name="compliance_states"),
    ]
