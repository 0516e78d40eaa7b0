"""What a client of /api/v1 can rely on: RFC 9457 problems with a request id (also in the
log), strict bodies and query strings, `Location` on a 201 and a marker on an idempotent
replay, `limit` honoured by every list, documented statuses and readable operationIds."""

from __future__ import annotations

import re
import uuid

import pytest
from django.contrib.auth.models import User
from django.test import Client

from api.views import api
from diagnosis.models import Session
from tests.api_helpers import call, token_for
from tests.web_helpers import NO_POSITION

pytestmark = pytest.mark.services
SESSIONS = "/api/v1/diagnosis-sessions"
OPEN = {"problem_type": "oil_spill", "description": NO_POSITION}


def test_errors_are_problem_details_with_a_request_id_in_the_log(
    db: None, alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    missing = uuid.uuid4()
    caplog.set_level("INFO", logger="api.errors")
    response = call("GET", f"{SESSIONS}/{missing}", token_for(alice))
    assert response.status_code == 404
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "urn:aero:problem:not_found" and body["title"] == "Not Found"
    assert (body["status"], body["instance"]) == (404, f"{SESSIONS}/{missing}")
    assert body["detail"] == f"No session {missing}."
    assert re.fullmatch(r"[0-9a-f]{32}", body["request_id"])
    assert response["X-Request-ID"] == body["request_id"]
    assert f"request_id={body['request_id']}" in caplog.text

    mine = call("GET", f"{SESSIONS}/{missing}", None, headers={"X-Request-ID": "client-id-123"})
    assert mine.status_code == 401 and mine.json()["request_id"] == "client-id-123"
    assert mine["Content-Type"] == "application/problem+json"
    unknown_path = call("GET", "/api/v1/nothing-here", token_for(alice))
    assert unknown_path["Content-Type"] == "application/problem+json"


def test_bodies_and_query_strings_are_strict(builtin: None, alice: User) -> None:
    token = token_for(alice)
    extra = call("POST", SESSIONS, token, {**OPEN, "priority": "high"})
    assert extra.status_code == 422 and "priority" in extra.json()["detail"]
    assert not Session.objects.exists()

    sid = call("POST", SESSIONS, token, OPEN).json()["session_id"]
    for raw in (b"-123", b"null", b"[]", b'"x"', b"{"):
        refused = Client().generic(
            "POST",
            f"{SESSIONS}/{sid}/cancel",
            raw,
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {token}",
        )
        assert refused.status_code in (400, 422), (raw, refused.content)
        assert refused["Content-Type"] == "application/problem+json"
    assert Session.objects.get(pk=sid).status != "canceled", "a malformed body canceled it"

    misspelt = call("GET", f"{SESSIONS}?stauts=canceled", token)
    assert misspelt.status_code == 422 and misspelt.json()["code"] == "unknown_parameter"
    assert "stauts" in misspelt.json()["detail"]
    history = call("GET", "/api/v1/history?sortt=created", token)
    assert history.status_code == 422 and history.json()["code"] == "unknown_parameter"
    assert call("GET", "/api/v1/history?sort=created&limit=1", token).status_code == 200


def test_created_has_a_location_and_a_replay_says_so(builtin: None, alice: User) -> None:
    token = token_for(alice)
    key = {"Idempotency-Key": "create-once-1"}
    first = call("POST", SESSIONS, token, OPEN, headers=key)
    assert first.status_code == 201
    sid = first.json()["session_id"]
    assert first["Location"] == f"{SESSIONS}/{sid}"
    assert "Idempotent-Replayed" not in first
    again = call("POST", SESSIONS, token, OPEN, headers=key)
    assert again.status_code == 201 and again.json()["session_id"] == sid
    assert again["Idempotent-Replayed"] == "true" and again["Location"] == first["Location"]
    assert call("GET", first["Location"], token).json()["id"] == sid


def test_history_honours_limit(builtin: None, alice: User) -> None:
    token = token_for(alice)
    for _ in range(3):
        call("POST", SESSIONS, token, OPEN)
    seen: list[str] = []
    query = "limit=2"
    while True:
        page = call("GET", f"/api/v1/history?{query}", token).json()
        assert len(page["sessions"]) <= 2
        seen += [row["id"] for row in page["sessions"]]
        if page["next_cursor"] is None:
            break
        query = f"limit=2&cursor={page['next_cursor']}"
    assert len(seen) == len(set(seen)) == 3


def test_every_status_is_documented_and_operation_ids_are_readable() -> None:
    schema = api.get_openapi_schema()
    ids = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            ids.append(operation["operationId"])
            responses = {str(k): v for k, v in operation["responses"].items()}
            assert "422" in responses, f"{method} {path}: 422 undocumented"
            if method == "post" and "requestBody" in operation:
                assert "400" in responses, f"{method} {path}: 400 undocumented"
            for status, response in responses.items():
                if int(status) >= 400:
                    assert list(response["content"]) == ["application/problem+json"]
                assert "X-Request-ID" in response["headers"]
    assert all(re.fullmatch(r"[a-z][A-Za-z]+", i) for i in ids), ids
    assert {"createSession", "listSessions", "cancelSession", "search"} <= set(ids)
    created = schema["paths"][SESSIONS]["post"]["responses"][201]["headers"]
    assert {"Location", "Idempotent-Replayed"} <= set(created)
