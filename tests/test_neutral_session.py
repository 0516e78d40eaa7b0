"""A whole session of a pack the core was not written for (tests/neutral_pack): opened,
run by the real job, its lookup recorded, its finding logged, its R2 action waiting in
the approval queue, approved twice (approve + confirm), executed once through the outbox,
reported, replayed and exported, with no airport word anywhere in its log and no airport
row in the database."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from approvals.actions import APPROVE, CONFIRM, do_decide
from approvals.models import Approval
from diagnosis.actions import do_create_session
from diagnosis.chain import verify_chain
from diagnosis.jobs import advance_session
from diagnosis.models import Event, ExternalEffect, Session, SessionStatus, ToolCall
from scenarios_admin.models import Scenario, ScenarioVersion
from tests import neutral_pack
from tests.neutral_pack import graph as neutral_graph
from tests.test_fitness_core import AIRPORT_WORDS

pytestmark = pytest.mark.services


@pytest.fixture
def neutral(transactional_db: None) -> Iterator[Scenario]:
    pack = dataclasses.replace(
        neutral_pack.pack(),
        graph=neutral_graph.build_graph,
        initial_state=neutral_graph.initial_state,
        opens_from_message=False,
    )
    scenario = Scenario.objects.create(
        slug="host_check", name_zh="主机检查", name_en="Host check", kind=neutral_pack.KIND
    )
    ScenarioVersion.objects.create(scenario=scenario, number=1, definition=neutral_graph.DEFINITION)
    with neutral_pack.installed(pack):
        yield scenario


def _log(session: Session) -> list[tuple[int, str, dict[str, Any]]]:
    return list(
        Event.objects.filter(session=session).order_by("seq").values_list("seq", "type", "payload")
    )


def _approve(approval: Approval, user: User) -> None:
    approval = do_decide(approval.pk, user, APPROVE, "host is down", digest=approval.digest)
    do_decide(approval.pk, user, CONFIRM, "confirmed", digest=approval.digest)


def test_a_neutral_session_runs_end_to_end_through_the_jobs(
    neutral: Scenario, alice: User, bob: User
) -> None:
    session = do_create_session(alice, neutral, "host down-1 stopped answering")
    advance_session(str(session.pk))  # a no-op when the inline job already ran it
    session.refresh_from_db()

    # The lookup ran as a recorded R0 call, its finding is logged, the action waits.
    assert session.status == SessionStatus.WAITING_USER
    lookup = ToolCall.objects.get(session=session, tool_name="lookup_host")
    assert (lookup.status, lookup.response_payload) == (
        "completed",
        {"host": "down-1", "up": False},
    )
    findings = [p for _, t, p in _log(session) if t == "finding.recorded"]
    assert findings == [{"kind": "host_note", "text": "down-1 is down"}]
    (approval,) = Approval.objects.filter(session=session)
    assert (approval.risk_class, approval.tool_call.tool_name) == ("R2", "restart_host")
    assert approval.tool_call.request_payload == {"host": "down-1"}

    _approve(approval, bob)
    advance_session(str(session.pk))
    session.refresh_from_db()

    # Executed once in its external system, reported, completed.
    assert session.status == SessionStatus.COMPLETED
    (effect,) = ExternalEffect.objects.filter(system=neutral_pack.SYSTEM)
    assert (effect.operation, effect.requests) == ("restart_host", 1)
    restart = ToolCall.objects.get(session=session, tool_name="restart_host")
    assert restart.status == "completed"
    assert restart.response_payload["summary"] == "Host restarted"
    report = session.report.markdown
    assert "down-1 was down" in report and "restart: completed" in report

    # The log is gap-free, chained and names nothing of the airport.
    log = _log(session)
    assert [seq for seq, _, _ in log] == list(range(1, len(log) + 1))
    assert verify_chain(session.pk).ok
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", json.dumps([t for t in log]))}
    assert not words & AIRPORT_WORDS

    # A job run again writes nothing.
    advance_session(str(session.pk))
    assert len(_log(session)) == len(log)


def test_a_host_that_is_up_needs_no_action(neutral: Scenario, alice: User) -> None:
    session = do_create_session(alice, neutral, "is h-7 fine?")
    advance_session(str(session.pk))
    session.refresh_from_db()
    assert session.status == SessionStatus.COMPLETED
    assert not Approval.objects.filter(session=session).exists()
    assert "h-7 was up" in session.report.markdown


def test_the_neutral_session_reads_on_its_pages_replay_and_export(
    neutral: Scenario, alice: User, carol: User
) -> None:
    session = do_create_session(alice, neutral, "is h-7 fine?")
    advance_session(str(session.pk))
    operator, auditor = Client(), Client()
    operator.force_login(alice)
    auditor.force_login(carol)
    page = operator.get(f"/sessions/{session.pk}/")
    assert page.status_code == 200 and "h-7" in page.content.decode()
    replay = auditor.get(f"/replay/{session.pk}/")
    assert replay.status_code == 200 and "h-7" in replay.content.decode()
    export = auditor.post(f"/replay/{session.pk}/export/")
    assert export.status_code == 200
    assert "h-7 was up" in export.content.decode()
