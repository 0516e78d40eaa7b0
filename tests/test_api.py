"""REST /api/v1: tokens, roles, idempotent creation, the snapshot, timeline pages, the
agent tree, and approvals decided through the same policy as the pages."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from aero.models import AuditLog
from api.models import ApiToken, IdempotencyKey, hash_token
from api.views import api
from approvals.actions import do_edit_args
from approvals.models import Approval, ApprovalStatus
from diagnosis.events import set_status
from diagnosis.models import Event, Session, ToolCallStatus
from tests.api_helpers import call, token_for
from tests.web_helpers import NO_POSITION, STAND_FUEL_LEAK, approval_for, waiting_session

pytestmark = pytest.mark.services
SESSIONS = "/api/v1/diagnosis-sessions"


def _operations() -> list[tuple[str, str]]:
    schema = api.get_openapi_schema()
    return [
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in ("get", "post")
    ]


def _concrete(path: str, session_id: Any = None, approval_id: int = 1) -> str:
    return (
        path.replace("{session_id}", str(session_id or uuid.uuid4()))
        .replace("{approval_id}", str(approval_id))
        .replace("{item_id}", "KB-001")
        .replace("{job_id}", uuid.uuid4().hex)
    )


# --- schema and docs ------------------------------------------------------------------


def test_openapi_31_schema_and_docs_from_our_static_files(db: None) -> None:
    schema = call("GET", "/api/v1/openapi.json").json()
    assert schema["openapi"] == "3.1.0"
    assert "/api/v1/diagnosis-sessions/{session_id}/timeline" in schema["paths"]
    assert schema["components"]["securitySchemes"]["TokenAuth"]["scheme"] == "bearer"

    docs = call("GET", "/api/v1/docs").content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in docs
    assert "cdn" not in docs.lower() and "https://" not in docs


def test_unknown_api_paths_answer_json_404(db: None, alice: User) -> None:
    response = call("GET", "/api/v1/no-such-thing", token_for(alice))
    assert response.status_code == 404
    body = response.json()
    assert (body["code"], body["detail"], body["status"]) == (
        "not_found",
        "No such API endpoint.",
        404,
    )


# --- authentication and roles ---------------------------------------------------------


def test_every_endpoint_refuses_a_missing_bad_revoked_or_expired_token(
    db: None, make_user: Callable[..., User]
) -> None:
    admin = make_user("root", "admin")
    revoked, revoked_raw = ApiToken.issue(admin, "old")
    revoked.revoke()
    _, expired_raw = ApiToken.issue(
        admin, "expired", expires_at=timezone.now() - timedelta(minutes=1)
    )
    operations = _operations()
    assert len(operations) == 28
    for method, path in operations:
        for token in (None, "aero_not-a-token", revoked_raw, expired_raw):
            response = call(method, _concrete(path), token)
            assert response.status_code == 401, (method, path, token)
            assert response.json()["code"] == "unauthenticated"
            assert response["WWW-Authenticate"].startswith("Bearer")
    assert not AuditLog.objects.filter(action="api.call").exists()


def test_inactive_users_tokens_stop_working(db: None, alice: User) -> None:
    token = token_for(alice)
    assert call("GET", f"{SESSIONS}/{uuid.uuid4()}", token).status_code == 404
    alice.is_active = False
    alice.save()
    assert call("GET", f"{SESSIONS}/{uuid.uuid4()}", token).status_code == 401


READS = {
    "listSessions",
    "search",
    "diagnosisHistory",
    "replaySession",
    "exportMarkdown",
    "exportJob",
    "getSession",
    "timeline",
    "agentTree",
    "pendingApprovals",
    "getApproval",
    "listKnowledgeItems",
    "getKnowledgeItem",
}
RUNS = {
    "createSession",
    "cancelSession",
    "resumeSession",
    "answerSession",
    "createKnowledgeItem",
}
DECIDES = {"approve", "confirm", "reject"}
# The stored bundle is raw: for those who read sessions unmasked (not auditors).
UNMASKED_READS = {"getSessionBundle"}
# tool servers, skills and providers
ADMINS = {
    "listMcpServers",
    "testMcpServer",
    "listLlmModels",
    "uploadSkill",
    "listSkills",
    "listSkillVersions",
}
# Which operations each role may reach (anything else is a 403).
ALLOWED = {
    "operator": READS | UNMASKED_READS | RUNS,
    "approver": READS | UNMASKED_READS | DECIDES,
    "auditor": READS,
    "admin": READS | UNMASKED_READS | RUNS | DECIDES | ADMINS,
    None: set(),
}


@pytest.mark.parametrize("role", ["operator", "approver", "auditor", "admin", None])
def test_role_matrix_for_every_endpoint(
    db: None, make_user: Callable[..., User], role: str | None
) -> None:
    """The role check comes before the lookup and the body: an allowed role gets a 404
    or a 422 here, a refused one a 403 whatever it sent."""
    user = make_user("someone", *([role] if role else []))
    token = token_for(user)
    schema = api.get_openapi_schema()
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            name = operation["operationId"]
            response = call(method.upper(), _concrete(path), token, {"x": 1})
            if name in ALLOWED[role]:
                assert response.status_code != 403, (role, name, response.json())
            else:
                assert response.status_code == 403, (role, name)
                assert response.json()["code"] == "forbidden"


def test_a_token_limited_to_some_roles_cannot_use_the_others(
    builtin: None, make_user: Callable[..., User]
) -> None:
    admin = make_user("root", "admin", "operator")
    read_only = token_for(admin, "auditor")  # the user is not an auditor: nothing is left
    operator_only = token_for(admin, "operator")

    refused = call("POST", SESSIONS, read_only, {"problem_type": "oil_spill", "description": "x"})
    assert refused.status_code == 403
    allowed = call(
        "POST", SESSIONS, operator_only, {"problem_type": "oil_spill", "description": NO_POSITION}
    )
    assert allowed.status_code == 201


def test_every_call_is_audited_with_the_token_id(builtin: None, alice: User) -> None:
    token, raw = ApiToken.issue(alice, "ci")
    missing = uuid.uuid4()

    call("GET", f"{SESSIONS}/{missing}", raw)
    created = call("POST", SESSIONS, raw, {"problem_type": "oil_spill", "description": "x"})

    entries = list(AuditLog.objects.filter(action="api.call").order_by("id"))
    assert [(e.object_id, e.detail["method"], e.detail["status"]) for e in entries] == [
        (str(token.pk), "GET", 404),
        (str(token.pk), "POST", created.status_code),
    ]
    assert entries[0].actor == alice
    assert entries[0].session_id == missing
    assert entries[0].object_type == "api.token"
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_tokens_are_stored_hashed(db: None, alice: User) -> None:
    token, raw = ApiToken.issue(alice, "ci")
    assert raw.startswith("aero_") and len(raw) > 40
    stored = ApiToken.objects.get(pk=token.pk)
    assert stored.token_hash == hash_token(raw)
    assert raw not in str(ApiToken.objects.filter(pk=token.pk).values().get())


# --- create, idempotency --------------------------------------------------------------


def test_create_session_with_an_idempotency_key(builtin: None, alice: User) -> None:
    token = token_for(alice)
    body = {"problem_type": "oil_spill", "description": NO_POSITION}
    key = {"Idempotency-Key": "create-1"}

    first = call("POST", SESSIONS, token, body, key)
    again = call("POST", SESSIONS, token, body, key)
    other = call("POST", SESSIONS, token, {**body, "description": "another incident"}, key)

    assert first.status_code == 201
    assert again.status_code == 201 and again.json() == first.json()
    assert other.status_code == 422
    assert other.json()["code"] == "idempotency_key_reused"
    assert Session.objects.count() == 1
    session = Session.objects.get()
    assert str(session.pk) == first.json()["session_id"]
    assert session.created_by == alice
    assert Event.objects.filter(session=session, type="session.created").count() == 1
    replayed = AuditLog.objects.filter(action="api.call").order_by("id")[1]
    assert replayed.detail["replayed"] is True

    # another user's identical key is their own
    bob_token = token_for(User.objects.create_user("otto"), name="x")
    assert call("POST", SESSIONS, bob_token, body, key).status_code == 403


def test_idempotency_keys_expire_after_24_hours(builtin: None, alice: User) -> None:
    token = token_for(alice)
    body = {"problem_type": "oil_spill", "description": NO_POSITION}
    key = {"Idempotency-Key": "nightly"}
    first = call("POST", SESSIONS, token, body, key).json()
    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=23))
    assert call("POST", SESSIONS, token, body, key).json() == first

    IdempotencyKey.objects.update(created_at=timezone.now() - timedelta(hours=25))
    later = call("POST", SESSIONS, token, body, key)

    assert later.status_code == 201
    assert later.json()["session_id"] != first["session_id"]
    assert Session.objects.count() == 2


def test_a_refused_create_does_not_burn_the_key(builtin: None, alice: User) -> None:
    token = token_for(alice)
    key = {"Idempotency-Key": "retry-me"}
    refused = call("POST", SESSIONS, token, {"problem_type": "nope", "description": "x"}, key)
    assert refused.status_code == 404
    assert refused.json()["code"] == "unknown_problem_type"
    ok = call("POST", SESSIONS, token, {"problem_type": "oil_spill", "description": "x"}, key)
    assert ok.status_code == 201


def test_bad_input_gets_a_json_error_naming_the_field(builtin: None, alice: User) -> None:
    token = token_for(alice)
    empty = call("POST", SESSIONS, token, {"problem_type": "oil_spill", "description": "   "})
    assert empty.status_code == 422
    assert empty.json()["code"] == "invalid_input"
    assert "description" in empty.json()["message"]
    bad_key = call(
        "POST",
        SESSIONS,
        token,
        {"problem_type": "oil_spill", "description": "x"},
        {"Idempotency-Key": "a b"},
    )
    assert bad_key.status_code == 422
    assert Session.objects.count() == 0


def test_errors_django_answers_around_the_views_are_json_and_audited(
    builtin: None, alice: User, settings: Any
) -> None:
    """A method the route does not take, a body over the upload limit, a session id that
    is no UUID: each a JSON error (never an HTML page), each call audited."""
    token = token_for(alice)
    wrong_method = call("DELETE", SESSIONS, token)
    assert wrong_method.status_code == 405
    assert wrong_method.json()["code"] == "method_not_allowed"
    assert "DELETE" in wrong_method.json()["message"] and "POST" in wrong_method["Allow"]

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2_000
    too_large = call(
        "POST", SESSIONS, token, {"problem_type": "oil_spill", "description": "x" * 3000}
    )
    assert too_large.status_code == 413
    assert too_large["Content-Type"] == "application/problem+json"
    assert too_large.json()["code"] == "payload_too_large"
    assert too_large.json()["detail"] == "The body is over the 2,000 bytes accepted."
    assert Session.objects.count() == 0

    for method, path in (
        ("GET", f"{SESSIONS}/xyz"),
        ("GET", f"{SESSIONS}/xyz/timeline"),
        ("POST", f"{SESSIONS}/xyz/answer"),
    ):
        malformed = call(method, path, token, {"text": "CA1234"} if method == "POST" else None)
        assert malformed.status_code == 422, (path, malformed.content[:200])
        assert malformed.json()["code"] == "invalid_input"
    statuses = list(
        AuditLog.objects.filter(action="api.call")
        .order_by("pk")
        .values_list("detail__status", flat=True)
    )
    assert statuses == [413, 422, 422, 422]  # the 405 came before the token was read


# --- reading ---------------------------------------------------------------------------


def test_snapshot_timeline_pages_and_agent_tree(
    builtin: None, alice: User, carol: User, django_assert_max_num_queries: Any
) -> None:
    created = call(
        "POST",
        SESSIONS,
        token_for(alice),
        {"problem_type": "oil_spill", "description": STAND_FUEL_LEAK},
    ).json()
    sid = created["session_id"]
    token = token_for(carol)  # auditors read

    snapshot = call("GET", f"{SESSIONS}/{sid}", token).json()
    assert snapshot["status"] == "waiting_user"
    assert snapshot["problem_type"] == "oil_spill"
    assert snapshot["snapshot"]["fields"]["position"] == "105"
    assert snapshot["open_approvals"] == Approval.objects.open().filter(session_id=sid).count()
    assert snapshot["open_approvals"] >= 4
    assert snapshot["created_by"] == "alice"

    seqs: list[int] = []
    query = "from_seq=1"
    while True:
        # 9: token, roles, session, events, and the audited call (the audit chain's lock,
        # its head, the entry)
        with django_assert_max_num_queries(10):
            page = call("GET", f"{SESSIONS}/{sid}/timeline?{query}&limit=7", token)
        body = page.json()
        assert len(body["events"]) <= 7
        seqs += [e["seq"] for e in body["events"]]
        if body["next_cursor"] is None:
            break
        query = f"cursor={body['next_cursor']}"
    assert seqs == list(range(1, snapshot["last_seq"] + 1))
    first = call("GET", f"{SESSIONS}/{sid}/timeline?limit=1", token).json()["events"][0]
    assert set(first) == {"event_id", "session_id", "type", "ts", "seq", "payload"}
    assert first["type"] == "session.created" and first["session_id"] == sid

    too_many = call("GET", f"{SESSIONS}/{sid}/timeline?limit=5000", token)
    assert too_many.status_code == 422 and too_many.json()["code"] == "invalid_input"

    tree = call("GET", f"{SESSIONS}/{sid}/agent-tree", token).json()
    assert tree["runs"], "the job's root run"
    root = tree["runs"][0]
    assert root["children"], "node runs under the job's run"
    assert {child["agent_name"] for child in root["children"]} >= {"reasoning"}


def test_list_sessions_newest_first_with_filters(builtin: None, alice: User, carol: User) -> None:
    token = token_for(alice)
    ids = [
        call(
            "POST", SESSIONS, token, {"problem_type": "oil_spill", "description": NO_POSITION}
        ).json()["session_id"]
        for _ in range(3)
    ]
    call("POST", f"{SESSIONS}/{ids[0]}/cancel", token, {})
    Session.objects.filter(pk=ids[1]).update(deleted_at=timezone.now())
    reader = token_for(carol)

    first = call("GET", f"{SESSIONS}?limit=1", reader).json()
    assert [s["id"] for s in first["sessions"]] == [ids[2]] and first["next_cursor"]
    # a session opened between two pages goes on top, never onto the next page again
    newer = call("POST", SESSIONS, token, {"problem_type": "oil_spill", "description": NO_POSITION})
    rest = call("GET", f"{SESSIONS}?limit=1&cursor={first['next_cursor']}", reader).json()
    assert [s["id"] for s in rest["sessions"]] == [ids[0]] and rest["next_cursor"] is None
    assert newer.json()["session_id"] not in {s["id"] for s in rest["sessions"]}
    bad = call("GET", f"{SESSIONS}?cursor=bm90LWEtY3Vyc29y", reader)
    assert bad.status_code == 404 and bad.json()["code"] == "invalid_cursor"
    other_list = call("GET", f"{SESSIONS}/{ids[2]}/timeline?limit=1", reader).json()
    misused = call("GET", f"{SESSIONS}?cursor={other_list['next_cursor']}", reader)
    assert misused.json()["code"] == "invalid_cursor", "a cursor is good for its own list"
    canceled = call("GET", f"{SESSIONS}?status=canceled", reader).json()["sessions"]
    assert [s["id"] for s in canceled] == [ids[0]]
    assert call("GET", f"{SESSIONS}?problem_type=bird_strike", reader).json()["sessions"] == []
    assert call("GET", f"{SESSIONS}?status=lost", reader).status_code == 422


def test_concurrent_creates_with_one_key_open_one_session(builtin: None, alice: User) -> None:
    token = token_for(alice)
    body = {"problem_type": "oil_spill", "description": NO_POSITION}
    barrier = threading.Barrier(3)
    responses: list[Any] = []

    def create() -> None:
        try:
            barrier.wait(timeout=10)
            responses.append(call("POST", SESSIONS, token, body, {"Idempotency-Key": "race"}))
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert [r.status_code for r in responses] == [201, 201, 201]
    assert len({r.json()["session_id"] for r in responses}) == 1
    assert Session.objects.count() == 1


def test_deleted_sessions_are_not_found(builtin: None, alice: User) -> None:
    session = waiting_session(alice)
    Session.objects.filter(pk=session.pk).update(deleted_at=timezone.now())
    response = call("GET", f"{SESSIONS}/{session.pk}", token_for(alice))
    assert response.status_code == 404 and response.json()["code"] == "not_found"


# --- acting on a session --------------------------------------------------------------


def test_answer_cancel_and_resume_go_through_the_actions(builtin: None, alice: User) -> None:
    token = token_for(alice)
    sid = call(
        "POST", SESSIONS, token, {"problem_type": "oil_spill", "description": "CA1234 fuel leak"}
    ).json()["session_id"]
    asked = call("GET", f"{SESSIONS}/{sid}", token).json()
    assert asked["snapshot"]["question"], "the agent asks where the spill is"

    answered = call("POST", f"{SESSIONS}/{sid}/answer", token, {"message": "105机位"})
    assert answered.status_code == 200
    assert answered.json()["snapshot"]["fields"]["position"] == "105"
    assert Event.objects.filter(session_id=sid, type="user.message", producer="api").exists()

    waiting = waiting_session(alice)  # waits for approvers, asks nothing
    # spaces alone are no answer: the schema says so (a pattern) and the view agrees
    pattern = call("GET", "/api/v1/openapi.json").json()["components"]["schemas"]["AnswerIn"][
        "properties"
    ]["message"]["pattern"]
    before = Event.objects.filter(session_id=sid).count()
    for blank in ("   ", "\u3000\n\t", "\xa0\u2003"):
        assert re.search(pattern, blank) is None
        spaces = call("POST", f"{SESSIONS}/{sid}/answer", token, {"message": blank})
        assert spaces.status_code == 422 and "message" in str(spaces.json()["errors"])
    assert re.search(pattern, " 105 ") and re.search(pattern, "\ufeff")
    assert Event.objects.filter(session_id=sid).count() == before  # nothing written
    nothing_asked = call("POST", f"{SESSIONS}/{waiting.pk}/answer", token, {"message": "hi"})
    assert nothing_asked.status_code == 409
    assert nothing_asked.json()["code"] == "action_refused"
    assert "has not asked anything" in nothing_asked.json()["message"]

    not_failed = call("POST", f"{SESSIONS}/{sid}/resume", token)
    assert not_failed.status_code == 409
    assert "Only a failed session can be retried." in not_failed.json()["message"]

    canceled = call("POST", f"{SESSIONS}/{sid}/cancel", token, {"reason": "drill over"})
    assert canceled.status_code == 200 and canceled.json()["status"] == "canceled"
    assert AuditLog.objects.filter(action="session.canceled", session_id=sid).exists()
    # a second cancel finds what it asked for: the same answer, nothing written again
    events = Event.objects.filter(session_id=sid).count()
    twice = call("POST", f"{SESSIONS}/{sid}/cancel", token, {})
    assert twice.status_code == 200 and twice.json()["status"] == "canceled"
    assert Event.objects.filter(session_id=sid).count() == events


def test_resume_requeues_a_failed_session(builtin: None, alice: User) -> None:
    session = waiting_session(alice)
    set_status(session.pk, "failed", producer="test", reason="worker died")
    response = call("POST", f"{SESSIONS}/{session.pk}/resume", token_for(alice))
    assert response.status_code == 200
    assert response.json()["status"] != "failed"
    assert AuditLog.objects.filter(action="session.retried", session_id=session.pk).exists()


# --- approvals ------------------------------------------------------------------------


def test_approvals_follow_the_pages_policy(builtin: None, alice: User, bob: User) -> None:
    session = waiting_session(alice, STAND_FUEL_LEAK)
    token = token_for(bob)
    pending = call("GET", f"{SESSIONS}/{session.pk}/pending-approvals", token).json()
    by_action = {item["action"]: item for item in pending}
    assert by_action["dispatch_cleanup_crew"]["risk_class"] == "R1"
    assert by_action["dispatch_cleanup_crew"]["next_step"] == "approve"

    r1 = approval_for(session, "dispatch_cleanup_crew")
    stale = call("POST", f"/api/v1/approvals/{r1.pk}/approve", token, {"digest": "0" * 64})
    assert stale.status_code == 409
    assert "not the one you were shown" in stale.json()["message"]
    r1.refresh_from_db()
    assert r1.status == ApprovalStatus.PENDING

    approved = call("POST", f"/api/v1/approvals/{r1.pk}/approve", token, {"digest": r1.digest})
    assert approved.status_code == 200
    assert approved.json()["status"] == "approved" and approved.json()["approver"] == "bob"
    r1.tool_call.refresh_from_db()
    assert r1.tool_call.status == ToolCallStatus.COMPLETED
    assert Event.objects.filter(
        session=session,
        type="approval.approved",
        producer="api",
        payload__tool_call=r1.tool_call_id,
    ).exists()
    assert AuditLog.objects.get(action="approval.approved", object_id=str(r1.pk)).actor == bob
    again = call("POST", f"/api/v1/approvals/{r1.pk}/approve", token, {"digest": r1.digest})
    assert again.status_code == 409

    r2 = approval_for(session, "suspend_stand_operations")
    first = call("POST", f"/api/v1/approvals/{r2.pk}/approve", token, {"digest": r2.digest})
    assert first.json()["status"] == "confirming" and first.json()["next_step"] == "confirm"
    repeat = call("POST", f"/api/v1/approvals/{r2.pk}/approve", token, {"digest": r2.digest})
    assert repeat.status_code == 409, "a second approve is not a confirmation"
    confirmed = call("POST", f"/api/v1/approvals/{r2.pk}/confirm", token, {"digest": r2.digest})
    assert confirmed.json()["status"] == "approved"

    other = Approval.objects.filter(session=session, status="pending").first()
    assert other is not None
    no_reason = call(
        "POST", f"/api/v1/approvals/{other.pk}/reject", token, {"digest": other.digest}
    )
    assert no_reason.status_code == 422
    rejected = call(
        "POST",
        f"/api/v1/approvals/{other.pk}/reject",
        token,
        {"digest": other.digest, "reason": "not needed"},
    )
    assert rejected.json()["status"] == "rejected" and rejected.json()["reason"] == "not needed"


def test_an_approval_says_who_changed_its_arguments(builtin: None, alice: User, bob: User) -> None:
    session = waiting_session(alice, STAND_FUEL_LEAK)
    closure = approval_for(session, "close_taxiway", taxiway="A")
    do_edit_args(closure.pk, bob, {"taxiway": "C"}, "A is the only way out", digest=closure.digest)

    pending = call("GET", f"{SESSIONS}/{session.pk}/pending-approvals", token_for(bob)).json()
    by_id = {item["id"]: item for item in pending}
    edited = by_id[closure.pk]["edited"]
    assert by_id[closure.pk]["args"] == {"taxiway": "C"}
    assert (edited["by"], edited["args_before"], edited["reason"]) == (
        "bob",
        {"taxiway": "A"},
        "A is the only way out",
    )
    assert [item["edited"] for item in pending if item["id"] != closure.pk] == [None] * (
        len(pending) - 1
    )


def test_unknown_approval_is_a_json_404(db: None, bob: User) -> None:
    response = call(
        "POST", "/api/v1/approvals/999999/approve", token_for(bob), {"digest": "a" * 64}
    )
    assert response.status_code == 404 and response.json()["code"] == "not_found"


# --- history, export, masking --------------------------------------------------------


def test_history_search_and_the_masked_export(
    builtin: None, alice: User, bob: User, carol: User
) -> None:
    session = waiting_session(alice, STAND_FUEL_LEAK)
    auditor = token_for(carol)

    found = call("GET", "/api/v1/history?flight=ca1234&problem_type=oil_spill", auditor).json()
    assert [s["id"] for s in found["sessions"]] == [str(session.pk)]
    assert found["sessions"][0]["position"] == "105"
    assert call("GET", "/api/v1/history?creator=nobody", auditor).json()["sessions"] == []
    assert call("GET", "/api/v1/history?cursor=garbage", auditor).status_code == 404

    export = call("POST", f"{SESSIONS}/{session.pk}/replay/export-md", auditor)
    assert export.status_code == 200
    assert export["Content-Type"].startswith("text/markdown")
    text = export.content.decode()
    assert str(session.pk) in text
    entry = AuditLog.objects.get(action="session.exported")
    assert entry.actor == carol and entry.detail["masked"] is True
    assert entry.detail["mode"] == "api"

    # an auditor sees R2 arguments masked, as on the replay pages; an approver does not
    r2 = approval_for(session, "suspend_stand_operations")
    assert call("GET", f"/api/v1/approvals/{r2.pk}", auditor).json()["args"] == "masked"
    assert call("GET", f"/api/v1/approvals/{r2.pk}", token_for(bob)).json()["args"] == {
        "stand": "105"
    }
    events = call("GET", f"{SESSIONS}/{session.pk}/timeline?limit=200", auditor).json()["events"]
    required = [e for e in events if e["type"] == "approval.required"]
    assert {e["payload"]["risk_level"] for e in required} >= {"R1", "R2"}
    for event in required:
        masked = event["payload"]["args"] == "masked"
        assert masked == (event["payload"]["risk_level"] in ("R2", "R3"))


def test_large_exports_run_in_the_background(
    builtin: None, alice: User, carol: User, settings: Any
) -> None:
    settings.AERO_REPLAY_EXPORT_INLINE_EVENTS = 1
    session = waiting_session(alice)
    token = token_for(alice)
    started = call("POST", f"{SESSIONS}/{session.pk}/replay/export-md", token)
    assert started.status_code == 202
    job_id = started.json()["job_id"]
    # the export ran after commit (inline jobs in tests); someone else cannot fetch it
    assert call("GET", f"/api/v1/exports/{job_id}", token_for(carol)).status_code == 404
    done = call("GET", f"/api/v1/exports/{job_id}", token)
    assert done.status_code == 200 and str(session.pk) in done.content.decode()
    assert AuditLog.objects.filter(action="session.exported", actor=alice).exists()
