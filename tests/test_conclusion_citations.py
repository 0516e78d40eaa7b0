"""A conclusion cites tool results of its own session (issue 35 item 6): an id that is no
answered evidence call of this session is a compliance violation on the timeline and is
dropped; a root cause left citing none is a violation too and is not reported (the
reporter is asked instead). Simulated here by a step that hands the conclusion evidence
ids the session never recorded, as a model's wording could."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from diagnosis.models import Event, Session, ToolCall
from packs.diagnosis import react_plan
from packs.diagnosis.sessions import start_from_bundle
from tests.api_helpers import call, token_for
from tests.test_diagnosis_sessions import SPEC
from tests.web_helpers import login

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def cite_elsewhere(monkeypatch: pytest.MonkeyPatch, tools: set[str] | None) -> None:
    """The evidence items of `tools` (None: every one) name ids of no call of the session."""
    real = react_plan.gather

    def gather(inv: Any, ctx: Any, run: Any, call: dict[str, Any]) -> dict[str, Any]:
        item = real(inv, ctx, run, call)
        if tools is None or item["tool"] in tools:
            return {**item, "id": f"ev-elsewhere-{item['tool']}"}
        return item

    monkeypatch.setattr(react_plan, "gather", gather)


def run_plan_execute(user: User) -> Session:
    session = start_from_bundle(
        user,
        SPEC / "ex-deploy-payments.tar.gz",
        {"producer": "t", "preferred_mode": "plan_execute"},
    )
    return Session.objects.get(pk=session.pk)


def root_cause(session: Session) -> dict[str, Any]:
    event = Event.objects.get(session=session, type="finding.recorded", payload__kind="root_cause")
    return dict(event.payload)


def test_a_cited_id_from_outside_the_session_is_a_violation_and_dropped(
    builtin: None, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    cite_elsewhere(monkeypatch, {"anomalies"})
    session = run_plan_execute(alice)

    (violation,) = Event.objects.filter(session=session, type="fsm.violation")
    assert violation.payload["kind"] == "foreign_evidence"
    assert violation.payload["ids"] == ["ev-elsewhere-anomalies"]
    found = root_cause(session)
    assert "ev-elsewhere-anomalies" not in found["evidence"]
    recorded = set(ToolCall.objects.filter(session=session).values_list("call_id", flat=True))
    assert set(found["evidence"]) <= recorded and "ev-deploys" in found["evidence"]
    # the rest stands: the deploy is the root cause and its fix waits for approval
    assert found["hypothesis"] == "bad_deploy" and session.status == "waiting_user"
    page = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk]))
    html = page.content.decode()
    assert 'data-testid="violation-foreign-evidence"' in html
    assert "no tool result of this session (ev-elsewhere-anomalies): dropped" in html


def test_a_root_cause_citing_no_result_of_the_session_is_not_reported(
    builtin: None, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    cite_elsewhere(monkeypatch, None)
    session = run_plan_execute(alice)

    kinds = [e.payload["kind"] for e in Event.objects.filter(session=session, type="fsm.violation")]
    assert kinds == ["foreign_evidence", "uncited_conclusion"]
    found = root_cause(session)
    assert found["hypothesis"] == "unknown" and found["fix"] is None
    assert found["evidence"] == ["ev-bundle"]
    # no hypothesis of it recorded, no fix proposed: the reporter is asked instead
    assert not Event.objects.filter(
        session=session, type="finding.recorded", payload__kind="hypothesis"
    ).exists()
    assert not ToolCall.objects.filter(session=session, is_action=True).exists()
    assert Event.objects.filter(session=session, type="agent.question").exists()
    body = call("GET", f"/api/v1/diagnosis-sessions/{session.pk}", token_for(alice)).json()
    assert body["snapshot"]["root_cause"]["hypothesis"] == "unknown"
    html = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk]))
    assert "cited no tool result of this session: not reported" in html.content.decode()
    assert body["snapshot"]["root_cause"]["service"] is None  # payments is not named
