import django.db.models.deletion
from django.db import migrations, models

# The apron draft's own rows (rules, spread radius, actions, examples) moved here from the
# core (scenarios_admin): the tables stay as they are (db_table), so this migration changes
# the state only; the content types follow the models, so permissions keep pointing at them.

MODELS = ("riskrule", "spreadradius", "scenarioaction", "scenarioexample")


def _move_content_types(apps, schema_editor, source="scenarios_admin", target="airport"):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        if not content_type.objects.filter(app_label=target, model=model).exists():
            content_type.objects.filter(app_label=source, model=model).update(app_label=target)


def _move_back(apps, schema_editor):
    _move_content_types(apps, schema_editor, source="airport", target="scenarios_admin")


class Migration(migrations.Migration):
    dependencies = [
        ("airport", "0002_restriction"),
        ("scenarios_admin", "0007_field_type_from_packs"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ScenarioAction",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "position",
                            models.PositiveIntegerField(
                                blank=True,
                                help_text="Order; lower first. Leave empty to add at the end.",
                                null=True,
                            ),
                        ),
                        ("tool", models.CharField(max_length=64)),
                        (
                            "risk_class",
                            models.CharField(
                                choices=[
                                    ("R0", "R0 (automatic, recorded)"),
                                    ("R1", "R1 (one confirmation)"),
                                    ("R2", "R2 (confirmed twice)"),
                                    ("R3", "R3 (forced confirmation with a reason)"),
                                ],
                                max_length=2,
                            ),
                        ),
                        (
                            "condition",
                            models.TextField(
                                blank=True,
                                help_text="As for risk rules, plus level=HIGH and impact.runways=non_empty.",
                            ),
                        ),
                        (
                            "for_each",
                            models.CharField(
                                blank=True,
                                help_text="One action per item of an impact list.",
                                max_length=32,
                            ),
                        ),
                        (
                            "args",
                            models.TextField(
                                blank=True,
                                help_text="One name=value per line; {fields.position}, {risk.level}, {item} are filled in.",
                            ),
                        ),
                        (
                            "scenario",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="draft_actions",
                                to="scenarios_admin.scenario",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "required action",
                        "db_table": "scenarios_admin_scenarioaction",
                        "ordering": ["scenario", "position", "id"],
                    },
                ),
                migrations.CreateModel(
                    name="ScenarioExample",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "position",
                            models.PositiveIntegerField(
                                blank=True,
                                help_text="Order; lower first. Leave empty to add at the end.",
                                null=True,
                            ),
                        ),
                        ("text", models.TextField(help_text="What an operator would write.")),
                        (
                            "expected_fields",
                            models.TextField(
                                help_text="e.g. flight_no=CA1234, position=105, continuous=true"
                            ),
                        ),
                        ("rule", models.CharField(max_length=32)),
                        (
                            "level",
                            models.CharField(
                                choices=[("HIGH", "HIGH"), ("MEDIUM", "MEDIUM"), ("LOW", "LOW")],
                                max_length=8,
                            ),
                        ),
                        (
                            "actions",
                            models.TextField(
                                help_text="Action tools expected, in order. Separated by commas or one per line."
                            ),
                        ),
                        (
                            "scenario",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="draft_examples",
                                to="scenarios_admin.scenario",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "example case",
                        "db_table": "scenarios_admin_scenarioexample",
                        "ordering": ["scenario", "position", "id"],
                    },
                ),
                migrations.CreateModel(
                    name="RiskRule",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "position",
                            models.PositiveIntegerField(
                                blank=True,
                                help_text="Order; lower first. Leave empty to add at the end.",
                                null=True,
                            ),
                        ),
                        ("rule_id", models.CharField(max_length=32, verbose_name="id")),
                        (
                            "condition",
                            models.TextField(
                                blank=True,
                                help_text="e.g. fluid_type=FUEL, continuous=true · phase=TAKEOFF_ROLL|CLIMB · phase!=STAND · a=1 OR b=2. Empty: always.",
                            ),
                        ),
                        (
                            "level",
                            models.CharField(
                                choices=[("HIGH", "HIGH"), ("MEDIUM", "MEDIUM"), ("LOW", "LOW")],
                                max_length=8,
                            ),
                        ),
                        ("score", models.PositiveSmallIntegerField(help_text="0-100")),
                        (
                            "scenario",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="draft_rules",
                                to="scenarios_admin.scenario",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "risk rule",
                        "db_table": "scenarios_admin_riskrule",
                        "ordering": ["scenario", "position", "id"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("scenario", "rule_id"), name="scenario_rule_id_unique"
                            )
                        ],
                    },
                ),
                migrations.CreateModel(
                    name="SpreadRadius",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        (
                            "key_value",
                            models.CharField(
                                blank=True,
                                help_text="Value of the 'radius depends on' field.",
                                max_length=64,
                                verbose_name="value",
                            ),
                        ),
                        (
                            "level",
                            models.CharField(
                                choices=[("HIGH", "HIGH"), ("MEDIUM", "MEDIUM"), ("LOW", "LOW")],
                                max_length=8,
                            ),
                        ),
                        ("hops", models.PositiveSmallIntegerField()),
                        (
                            "scenario",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="draft_radii",
                                to="scenarios_admin.scenario",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "spread radius",
                        "verbose_name_plural": "spread radius table",
                        "db_table": "scenarios_admin_spreadradius",
                        "ordering": ["scenario", "key_value", "id"],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("scenario", "key_value", "level"),
                                name="scenario_radius_unique",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(_move_content_types, _move_back),
    ]
