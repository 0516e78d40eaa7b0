import django.db.models.deletion
from django.db import migrations, models

# The apron draft's settings (impact start, spread radius key and default, compliance
# states) leave the core's Scenario for a row of their own, one per apron scenario; the
# values are copied here and back (scenarios_admin 0009 then drops the core's columns).

COLUMNS = ("impact_start", "radius_key", "default_radius", "compliance_states")


def _copy_in(apps, schema_editor):
    scenario = apps.get_model("scenarios_admin", "Scenario")
    settings = apps.get_model("airport", "ApronDraft")
    settings.objects.bulk_create(
        settings(scenario_id=row["pk"], **{c: row[c] for c in COLUMNS})
        for row in scenario.objects.filter(kind="apron").values("pk", *COLUMNS)
    )


def _copy_back(apps, schema_editor):
    scenario = apps.get_model("scenarios_admin", "Scenario")
    settings = apps.get_model("airport", "ApronDraft")
    for row in settings.objects.values("scenario_id", *COLUMNS):
        scenario.objects.filter(pk=row["scenario_id"]).update(**{c: row[c] for c in COLUMNS})


class Migration(migrations.Migration):
    dependencies = [
        ("airport", "0003_draft_rows"),
        ("scenarios_admin", "0008_draft_rows_to_airport_pack"),
    ]

    operations = [
        migrations.CreateModel(
            name="ApronDraft",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "impact_start",
                    models.CharField(
                        blank=True,
                        help_text="The position field whose node starts the impact analysis.",
                        max_length=64,
                        verbose_name="impact starts at",
                    ),
                ),
                (
                    "radius_key",
                    models.CharField(
                        blank=True,
                        help_text="An enum field whose value selects the spread radius row; empty: by level only.",
                        max_length=64,
                        verbose_name="radius depends on",
                    ),
                ),
                (
                    "default_radius",
                    models.PositiveSmallIntegerField(
                        default=1, help_text="Hops when no spread radius row matches."
                    ),
                ),
                ("compliance_states", models.JSONField(blank=True, default=list)),
                (
                    "scenario",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="apron_draft",
                        to="scenarios_admin.scenario",
                    ),
                ),
            ],
            options={"verbose_name": "apron settings", "verbose_name_plural": "apron settings"},
        ),
        migrations.RunPython(_copy_in, _copy_back),
    ]
