"""`POST /api/v1/diagnosis-sessions/bundle`: a script opens an IT diagnosis from an
incident bundle (multipart), safely retried with an Idempotency-Key; a bad bundle is a
422 naming its file, line and field, and nothing is created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from diagnosis.models import Event, Session
from tests.api_helpers import token_for

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
URL = "/api/v1/diagnosis-sessions/bundle"

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def post(token: str | None, data: dict[str, Any], key: str = "") -> Any:
    headers: dict[str, str] = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if key:
        headers["Idempotency-Key"] = key
    return Client().post(URL, data, headers=headers)


def archive(name: str = "ex-pool-inventory") -> Any:
    return (EXAMPLES / f"{name}.tar.gz").open("rb")


def test_a_bundle_opens_a_diagnosis_once_per_key(builtin: None, alice: User) -> None:
    token = token_for(alice, "operator")
    with archive() as first:
        created = post(token, {"bundle": first, "problem_type": "resource_exhaustion"}, "k-1")
    assert created.status_code == 201, created.content
    session_id = created.json()["session_id"]
    assert created["Location"].endswith(f"/diagnosis-sessions/{session_id}")

    with archive() as again:
        replay = post(token, {"bundle": again, "problem_type": "resource_exhaustion"}, "k-1")
    assert replay.status_code == 201 and replay.json()["session_id"] == session_id
    assert replay["Idempotent-Replayed"] == "true"
    assert Session.objects.count() == 1

    session = Session.objects.get()
    assert session.scenario.kind == "diagnosis"
    assert session.snapshot["root_cause"]["service"] == "inventory"
    requested = Event.objects.get(session=session, type="diagnosis.requested")
    assert requested.payload["problem_type"] == "resource_exhaustion"
    # the session reads like any other through the API
    got = Client().get(
        f"/api/v1/diagnosis-sessions/{session_id}", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert got.status_code == 200
    cause = got.json()["snapshot"]["root_cause"]
    assert (cause["hypothesis"], cause["service"]) == ("db_pool_exhausted", "inventory")


def test_a_bad_bundle_is_a_422_with_where(builtin: None, alice: User, tmp_path: Path) -> None:
    token = token_for(alice, "operator")
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(b"not an archive at all")
    with bad.open("rb") as upload:
        refused = post(token, {"bundle": upload})
    assert refused.status_code == 422
    assert refused["Content-Type"] == "application/problem+json"
    body = refused.json()
    assert body["code"] == "invalid_bundle"
    assert "not a folder, .zip or .tar.gz bundle" in body["detail"]
    assert not Session.objects.exists()


def test_an_unknown_problem_type_creates_nothing(builtin: None, alice: User) -> None:
    token = token_for(alice, "operator")
    with archive() as upload:
        refused = post(token, {"bundle": upload, "problem_type": "volcano"})
    assert refused.status_code == 422
    assert "Unknown problem type volcano" in refused.json()["detail"]
    assert not Session.objects.exists()


def test_only_those_who_run_sessions(builtin: None, bob: User, carol: User) -> None:
    for token in (None, token_for(bob, "approver"), token_for(carol, "auditor")):
        with archive() as upload:
            response = post(token, {"bundle": upload})
        assert response.status_code == (401 if token is None else 403)
    assert not Session.objects.exists()


def test_the_openapi_document_describes_it(builtin: None) -> None:
    schema = Client().get("/api/v1/openapi.json").json()
    operation = schema["paths"][URL]["post"]
    assert operation["operationId"] == "createFromBundle"
    body = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert "bundle" in str(body)
    assert "Location" in operation["responses"]["201"]["headers"]
    assert "Idempotency-Key" in str(operation["parameters"])
