import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# The restrictions in force moved here from the core (diagnosis): the table stays as it is
# (db_table), so this migration changes the state only; the content type follows the
# model, so admin log entries and permissions keep pointing at it.


def _move_content_type(apps, schema_editor, source="diagnosis", target="airport"):
    content_type = apps.get_model("contenttypes", "ContentType")
    if not content_type.objects.filter(app_label=target, model="restriction").exists():
        content_type.objects.filter(app_label=source, model="restriction").update(
            app_label=target
        )


def _move_back(apps, schema_editor):
    _move_content_type(apps, schema_editor, source="airport", target="diagnosis")


class Migration(migrations.Migration):
    dependencies = [
        ("airport", "0001_world"),
        ("diagnosis", "0012_llmcall_estimated_error_class"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Restriction",
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
                            "kind",
                            models.CharField(
                                choices=[
                                    ("runway", "Runway closed"),
                                    ("taxiway", "Taxiway closed"),
                                    ("stand", "Stand operations suspended"),
                                ],
                                max_length=16,
                            ),
                        ),
                        ("target", models.CharField(max_length=32)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("lifted_at", models.DateTimeField(blank=True, null=True)),
                        ("lift_note", models.CharField(blank=True, max_length=300)),
                        (
                            "lifted_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "session",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="restrictions",
                                to="diagnosis.session",
                            ),
                        ),
                        (
                            "tool_call",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="restriction",
                                to="diagnosis.toolcall",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "diagnosis_restriction",
                        "ordering": ["kind", "target", "-created_at"],
                        "indexes": [
                            models.Index(
                                condition=models.Q(("lifted_at__isnull", True)),
                                fields=["kind", "target"],
                                name="restriction_active_idx",
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(_move_content_type, _move_back),
    ]
