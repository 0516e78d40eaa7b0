"""Seed 003's REST endpoints over a concluded IT diagnosis: its timeline, replay and
Markdown export, cancel and resume (each written as events, each safe to repeat), and
history by problem type, service and dates; each refused to those who may not."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from api.views import api
from diagnosis.events import set_status
from diagnosis.models import Event, Session
from packs.diagnosis.playbook_data import default_playbook
from packs.diagnosis.sessions import start_from_bundle
from replay import history
from tests.api_helpers import call, token_for
from tests.web_helpers import login

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
SESSIONS = "/api/v1/diagnosis-sessions"

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def diagnose(user: User, example: str = "ex-pool-inventory") -> Session:
    session = start_from_bundle(user, EXAMPLES / f"{example}.tar.gz", {"producer": "test"})
    return Session.objects.get(pk=session.pk)


def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["status"] == status and body["detail"]
    return body


def test_the_openapi_document_has_every_diagnosis_endpoint(db: None) -> None:
    paths = api.get_openapi_schema()["paths"]
    for path, method in (
        ("/diagnosis-sessions/{session_id}/timeline", "get"),
        ("/diagnosis-sessions/{session_id}/replay", "get"),
        ("/diagnosis-sessions/{session_id}/replay/export-md", "post"),
        ("/diagnosis-sessions/{session_id}/cancel", "post"),
        ("/diagnosis-sessions/{session_id}/resume", "post"),
        ("/diagnosis-sessions/history", "get"),
        ("/history", "get"),
    ):
        assert method in paths[f"/api/v1{path}"], path
    history = {p["name"] for p in paths["/api/v1/diagnosis-sessions/history"]["get"]["parameters"]}
    assert {"problem_type", "service", "from", "to"} <= history
    cancel = paths["/api/v1/diagnosis-sessions/{session_id}/cancel"]["post"]
    assert "Idempotency-Key" in str(cancel["parameters"])


# --- timeline and replay ----------------------------------------------------------------


def test_timeline_and_replay_of_a_diagnosis(builtin: None, alice: User, carol: User) -> None:
    session = diagnose(alice)
    token = token_for(alice)
    page = call("GET", f"{SESSIONS}/{session.pk}/timeline?from_seq=2&limit=5", token).json()
    assert [e["seq"] for e in page["events"]] == [2, 3, 4, 5, 6]
    assert page["next_cursor"]
    types = {
        e["type"]
        for e in call("GET", f"{SESSIONS}/{session.pk}/timeline?limit=200", token).json()["events"]
    }
    assert "finding.recorded" in types

    replay = call("GET", f"{SESSIONS}/{session.pk}/replay", token).json()
    assert replay["seq"] == replay["last_seq"] == session.last_seq
    assert replay["masked"] is False and replay["deleted"] is False
    cause = replay["state"]["snapshot"]["root_cause"]
    assert (cause["hypothesis"], cause["service"]) == ("db_pool_exhausted", "inventory")
    tools = [c["tool_name"] for c in replay["state"]["tool_calls"]]
    assert "log_signatures" in tools and "restart_service" in tools
    assert replay["navigation"]["next"] is None

    # the session as it stood before it concluded: no root cause yet
    finding = Event.objects.filter(session=session, type="finding.recorded").order_by("seq")[0]
    before = call("GET", f"{SESSIONS}/{session.pk}/replay?seq={finding.seq - 1}", token).json()
    assert "root_cause" not in before["state"]["snapshot"]
    assert before["event"]["seq"] == finding.seq - 1
    assert before["navigation"]["next"] == finding.seq
    # an auditor reads it masked, as on the replay pages
    assert call("GET", f"{SESSIONS}/{session.pk}/replay", token_for(carol)).json()["masked"]


def test_timeline_and_replay_refuse_bad_input_and_those_who_may_not(
    builtin: None, alice: User, dave: User
) -> None:
    session = diagnose(alice)
    token = token_for(alice)
    for path in ("timeline", "replay"):
        url = f"{SESSIONS}/{session.pk}/{path}"
        assert call("GET", url).status_code == 401
        problem(call("GET", url, token_for(dave)), 403, "forbidden")  # no role at all
        problem(call("GET", f"{SESSIONS}/{uuid4()}/{path}", token), 404, "not_found")
    bad = problem(
        call("GET", f"{SESSIONS}/{session.pk}/timeline?limit=0", token), 422, "invalid_input"
    )
    assert "limit" in str(bad["errors"])
    problem(
        call("GET", f"{SESSIONS}/{session.pk}/timeline?from_seq=x", token), 422, "invalid_input"
    )
    beyond = problem(
        call("GET", f"{SESSIONS}/{session.pk}/replay?seq={session.last_seq + 1}", token),
        404,
        "no_such_step",
    )
    assert f"has {session.last_seq} events" in beyond["detail"]
    problem(call("GET", f"{SESSIONS}/{session.pk}/replay?seq=-1", token), 422, "invalid_input")

    # a deleted session: gone from the live endpoints; replay keeps it for audit, marked
    Session.objects.filter(pk=session.pk).update(deleted_at=timezone.now())
    problem(call("GET", f"{SESSIONS}/{session.pk}/timeline", token), 404, "not_found")
    assert call("GET", f"{SESSIONS}/{session.pk}/replay", token).json()["deleted"] is True


def test_the_markdown_export_of_a_diagnosis(builtin: None, alice: User, dave: User) -> None:
    session = diagnose(alice)
    url = f"{SESSIONS}/{session.pk}/replay/export-md"
    export = call("POST", url, token_for(alice))
    assert export.status_code == 200 and export["Content-Type"].startswith("text/markdown")
    assert str(session.pk) in export.content.decode()
    assert call("POST", url).status_code == 401
    problem(call("POST", url, token_for(dave)), 403, "forbidden")
    problem(
        call("POST", f"{SESSIONS}/{uuid4()}/replay/export-md", token_for(alice)), 404, "not_found"
    )
    problem(
        call("POST", f"{SESSIONS}/not-a-uuid/replay/export-md", token_for(alice)),
        422,
        "invalid_input",
    )


# --- cancel and resume ------------------------------------------------------------------


def test_cancel_is_an_event_once_and_safe_to_repeat(builtin: None, alice: User) -> None:
    session = diagnose(alice)  # waits for an approver of its fix
    assert session.status == "waiting_user"
    token = token_for(alice)
    url = f"{SESSIONS}/{session.pk}/cancel"
    first = call("POST", url, token, {"reason": "fixed by hand"}, {"Idempotency-Key": "c-1"})
    assert first.status_code == 200 and first.json()["status"] == "canceled"
    changed = Event.objects.get(
        session=session, type="session.status_changed", payload__to="canceled"
    )
    assert changed.producer == "api"
    count = Event.objects.filter(session=session).count()

    again = call("POST", url, token, {"reason": "fixed by hand"}, {"Idempotency-Key": "c-1"})
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    keyless = call("POST", url, token, {})
    assert keyless.status_code == 200 and keyless.json()["status"] == "canceled"
    assert Event.objects.filter(session=session).count() == count, "nothing written twice"
    # the same key for another request is refused
    problem(
        call("POST", url, token, {"reason": "other"}, {"Idempotency-Key": "c-1"}),
        422,
        "idempotency_key_reused",
    )


def test_cancel_refuses_bad_input_and_those_who_may_not(
    builtin: None, alice: User, bob: User, carol: User
) -> None:
    session = diagnose(alice)
    url = f"{SESSIONS}/{session.pk}/cancel"
    assert call("POST", url, None, {}).status_code == 401
    for reader in (bob, carol):  # approvers and auditors do not run sessions
        problem(call("POST", url, token_for(reader), {}), 403, "forbidden")
    token = token_for(alice)
    problem(call("POST", url, token, {"why": "x"}), 422, "invalid_input")
    problem(call("POST", url, token, {"reason": "x" * 5000}), 422, "invalid_input")
    problem(call("POST", url, token, {}, {"Idempotency-Key": "bad key"}), 422, "invalid_input")
    problem(call("POST", f"{SESSIONS}/{uuid4()}/cancel", token, {}), 404, "not_found")
    Session.objects.filter(pk=session.pk).update(deleted_at=timezone.now())
    problem(call("POST", url, token, {}), 404, "not_found")
    assert Session.objects.get(pk=session.pk).status == "waiting_user"


def test_cancel_of_a_session_that_ended_otherwise_is_a_conflict(builtin: None, alice: User) -> None:
    session = diagnose(alice)
    set_status(session.pk, "completed", producer="test")
    refused = problem(
        call("POST", f"{SESSIONS}/{session.pk}/cancel", token_for(alice), {}), 409, "action_refused"
    )
    assert "already completed" in refused["detail"]


def test_resume_requeues_a_failed_diagnosis_once_per_key(builtin: None, alice: User) -> None:
    session = diagnose(alice)
    set_status(session.pk, "failed", producer="test", reason="worker died")
    token = token_for(alice)
    url = f"{SESSIONS}/{session.pk}/resume"
    first = call("POST", url, token, None, {"Idempotency-Key": "r-1"})
    assert first.status_code == 200 and first.json()["status"] != "failed"
    retried = Event.objects.filter(
        session=session, type="session.status_changed", payload__to="queued", producer="api"
    )
    assert retried.count() == 1
    again = call("POST", url, token, None, {"Idempotency-Key": "r-1"})
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert retried.count() == 1, "a retried resume queues nothing more"
    # without a key, a session that is not failed is a conflict, and nothing is written
    refused = problem(call("POST", url, token), 409, "action_refused")
    assert "Only a failed session" in refused["detail"]
    assert retried.count() == 1


def test_resume_refuses_those_who_may_not(builtin: None, alice: User, carol: User) -> None:
    session = diagnose(alice)
    set_status(session.pk, "failed", producer="test", reason="worker died")
    url = f"{SESSIONS}/{session.pk}/resume"
    assert call("POST", url).status_code == 401
    problem(call("POST", url, token_for(carol)), 403, "forbidden")
    problem(
        call("POST", url, token_for(alice), None, {"Idempotency-Key": "é"}), 422, "invalid_input"
    )
    problem(call("POST", f"{SESSIONS}/{uuid4()}/resume", token_for(alice)), 404, "not_found")
    assert Session.objects.get(pk=session.pk).status == "failed"


# --- history ------------------------------------------------------------------------------


def test_history_by_problem_type_service_and_dates(builtin: None, alice: User, carol: User) -> None:
    pool = diagnose(alice, "ex-pool-inventory")
    deploy = diagnose(alice, "ex-deploy-payments")
    token = token_for(carol)

    def found(path: str, query: str) -> list[str]:
        response = call("GET", f"{path}?{query}", token)
        assert response.status_code == 200, response.content
        return [s["id"] for s in response.json()["sessions"]]

    pool_cause = pool.snapshot["root_cause"]
    deploy_cause = deploy.snapshot["root_cause"]
    assert pool_cause["service"] != deploy_cause["service"]
    for path in ("/api/v1/history", f"{SESSIONS}/history"):
        assert found(path, f"service={pool_cause['service']}") == [str(pool.pk)]
        assert found(path, f"problem_type={deploy_cause['problem_type']}") == [str(deploy.pk)]
        assert found(path, "problem_type=it_diagnosis") == [str(deploy.pk), str(pool.pk)]
        today = timezone.localdate()
        dates = f"from={today - timedelta(days=1)}&to={today}"
        assert found(path, dates) == [str(deploy.pk), str(pool.pk)]
        assert found(path, f"to={today - timedelta(days=1)}") == []
        assert found(path, "service=no-such-service") == []
        assert found(path, "problem_type=no_such_type") == []
    row = call("GET", f"{SESSIONS}/history?service=inventory", token).json()["sessions"][0]
    assert row["facts"] == {
        "problem_type": pool_cause["problem_type"],
        "service": pool_cause["service"],
    }


def test_history_refuses_bad_input_and_those_without_a_role(
    builtin: None, alice: User, dave: User
) -> None:
    token = token_for(alice)
    for path in ("/api/v1/history", f"{SESSIONS}/history"):
        assert call("GET", path).status_code == 401
        problem(call("GET", path, token_for(dave)), 403, "forbidden")
        problem(call("GET", f"{path}?from=yesterday", token), 422, "invalid_input")
        problem(call("GET", f"{path}?service=a%20b", token), 422, "invalid_input")
        both = problem(
            call("GET", f"{path}?from=2026-01-01&since=2026-01-01", token), 422, "invalid_input"
        )
        assert "since" in both["detail"]


# --- the history page ---------------------------------------------------------------------


def test_the_history_page_filters_diagnoses_by_problem_type_and_service(
    builtin: None, alice: User, carol: User
) -> None:
    """A plain GET form (no script needed): the pack's filters beside the core's, each
    row saying what the diagnosis concluded, in English and Chinese."""
    pool = diagnose(alice, "ex-pool-inventory")
    deploy = diagnose(alice, "ex-deploy-payments")
    client = login(carol)
    url = reverse("replay:history")

    form = client.get(url).content.decode()
    assert '<select name="service"' in form and '<option value="inventory">' in form
    assert '<select name="problem_type"' in form
    assert f'data-session="{pool.pk}"' in form and f'data-session="{deploy.pk}"' in form

    by_service = client.get(url, {"service": "inventory"}).content.decode()
    assert f'data-session="{pool.pk}"' in by_service
    assert f'data-session="{deploy.pk}"' not in by_service
    assert '<small class="muted" data-fact="service">inventory</small>' in by_service
    assert '<option value="inventory" selected>' in by_service

    kind = deploy.snapshot["root_cause"]["problem_type"]
    by_type = client.get(url, {"problem_type": kind}).content.decode()
    assert f'data-session="{deploy.pk}"' in by_type
    assert f'data-session="{pool.pk}"' not in by_type

    bad = client.get(url, {"service": "no-such-service"})
    assert bad.status_code == 400

    with override_settings(LANGUAGE_CODE="zh-hans"):
        chinese = login(carol).get(url).content.decode()
    assert "问题类型" in chinese and "服务" in chinese
    chinese_kind = default_playbook().problem_types[kind]["zh"]
    assert f'data-fact="problem_type">{chinese_kind}<' in chinese


def test_the_diagnosis_filters_are_indexed(db: None) -> None:
    """The search writes the expression the pack's migration indexes (a bound array of
    keys would not match it), so a filter over many sessions needs no full scan."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for name, value in (("service", "inventory"), ("problem_type", "error_spike")):
            plan = history.search_queryset({name: value}).explain()
            assert f"diagnosis_pack_session_{name}" in plan, plan
