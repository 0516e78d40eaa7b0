"""The restrictions in force moved from the core (diagnosis) to the airport pack as a
state-only migration: an upgrade keeps every row, and the admin's history and
permissions keep pointing at them (the content type moved with the model)."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from diagnosis.models import ToolCall
from packs.airport.models import Restriction
from tests.web_helpers import waiting_session

BEFORE = [("diagnosis", "0012_llmcall_estimated_error_class"), ("airport", "0001_world")]


def _migrate(targets: list[tuple[str, str]] | None = None) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.migrate(targets or executor.loader.graph.leaf_nodes())
    ContentType.objects.clear_cache()
    return executor


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_keeps_every_restriction_and_its_admin_history(
    builtin: None, alice: User
) -> None:
    session = waiting_session(alice)
    calls = list(ToolCall.objects.filter(session=session).order_by("pk")[:2])
    executor = _migrate(BEFORE)
    try:
        old_apps = executor.loader.project_state(BEFORE).apps
        old = old_apps.get_model("diagnosis", "Restriction")
        in_force = old.objects.create(
            kind="taxiway", target="A", session_id=session.pk, tool_call_id=calls[0].pk
        )
        lifted = old.objects.create(
            kind="stand",
            target="105",
            session_id=session.pk,
            tool_call_id=calls[1].pk,
            lifted_by_id=alice.pk,
            lift_note="cleaned",
        )
        old.objects.filter(pk=lifted.pk).update(lifted_at=lifted.created_at)
        content_type = ContentType.objects.get(app_label="diagnosis", model="restriction")
        entry = LogEntry.objects.create(
            user=alice,
            content_type=content_type,
            object_id=str(in_force.pk),
            object_repr="Taxiway closed: A",
            action_flag=CHANGE,
        )
    finally:
        _migrate()

    rows = {r.pk: r for r in Restriction.objects.all()}
    assert set(rows) == {in_force.pk, lifted.pk}
    assert (rows[in_force.pk].kind, rows[in_force.pk].target, rows[in_force.pk].is_active) == (
        "taxiway",
        "A",
        True,
    )
    assert rows[lifted.pk].lifted_by == alice and rows[lifted.pk].lift_note == "cleaned"
    assert rows[in_force.pk].session == session and rows[in_force.pk].tool_call == calls[0]
    moved = ContentType.objects.get_for_model(Restriction)
    assert (moved.pk, moved.app_label) == (content_type.pk, "airport")
    assert not ContentType.objects.filter(app_label="diagnosis", model="restriction").exists()
    assert LogEntry.objects.get(pk=entry.pk).get_edited_object() == rows[in_force.pk]
    assert Permission.objects.filter(content_type=moved, codename="view_restriction").exists()
