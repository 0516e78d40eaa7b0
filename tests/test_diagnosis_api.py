"""`POST /api/v1/diagnosis-sessions` with a multipart body: a script opens an IT diagnosis
from an incident bundle on the same operation that takes the apron's JSON, safely retried
with an Idempotency-Key (the same key with another body is refused); a bad bundle or a
bad field is a problem naming what is wrong, and nothing is created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from diagnosis.models import Event, Session
from tests.api_helpers import call, token_for

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
URL = "/api/v1/diagnosis-sessions"

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def stored(tmp_path: Path) -> list[Path]:
    """The bundles kept for sessions (one folder each)."""
    folder = tmp_path / "stored"
    return sorted(folder.iterdir()) if folder.exists() else []


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


def test_the_same_key_with_another_body_is_refused_and_creates_nothing(
    builtin: None, alice: User, tmp_path: Path
) -> None:
    token = token_for(alice, "operator")
    with archive() as upload:
        first = post(token, {"bundle": upload}, "k-2")
    assert first.status_code == 201
    # another bundle, another field, or the JSON body under the same key
    with archive("ex-deploy-payments") as other:
        refused = [post(token, {"bundle": other}, "k-2")]
    with archive() as same:
        refused.append(post(token, {"bundle": same, "title": "Stock checks"}, "k-2"))
    refused.append(
        call(
            "POST",
            URL,
            token,
            {"problem_type": "oil_spill", "description": "fuel"},
            {"Idempotency-Key": "k-2"},
        )
    )
    for response in refused:
        assert response.status_code == 422, response.content
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["code"] == "idempotency_key_reused"
    assert Session.objects.count() == 1 and len(stored(tmp_path)) == 1


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({}, "file.bundle: Field required"),
        ({"priority": "high"}, "form.priority: Extra inputs are not permitted"),
        ({"preferred_mode": "fastest"}, "form.preferred_mode: Input should be"),
        ({"problem_type": "Error Spike"}, "form.problem_type: String should match pattern"),
        ({"title": ["one", "two"]}, "form.title: Sent more than once"),
    ],
)
def test_a_bad_field_is_a_422_naming_it_and_creates_nothing(
    builtin: None, alice: User, tmp_path: Path, fields: dict[str, Any], where: str
) -> None:
    token = token_for(alice, "operator")
    with archive() as upload:
        data = {**fields, "bundle": upload} if fields else {"title": "no bundle"}
        refused = post(token, data, "k-bad")
    assert refused.status_code == 422, refused.content
    assert refused.json()["detail"].startswith(where), refused.json()
    assert not Session.objects.exists() and stored(tmp_path) == []
    # the refusal kept no key: the corrected request goes through under it
    with archive() as upload:
        assert post(token, {"bundle": upload}, "k-bad").status_code == 201


def test_a_second_file_is_refused(builtin: None, alice: User) -> None:
    token = token_for(alice, "operator")
    with archive() as upload, archive("ex-deploy-payments") as extra:
        refused = post(token, {"bundle": upload, "logs": extra})
    assert refused.status_code == 422
    assert refused.json()["detail"] == "file.logs: Extra inputs are not permitted"
    assert not Session.objects.exists()


def test_other_bodies_are_refused_with_a_problem(builtin: None, alice: User) -> None:
    token = token_for(alice, "operator")
    auth = {"Authorization": f"Bearer {token}"}
    text = Client().generic(
        "POST", URL, b"fuel leak at 105", content_type="text/plain", headers=auth
    )
    assert text.status_code == 415 and text["Content-Type"] == "application/problem+json"
    assert text.json()["code"] == "unsupported_media_type"
    assert "multipart/form-data" in text.json()["detail"]
    broken = Client().generic(
        "POST", URL, b"--x\r\nnonsense", content_type="multipart/form-data; boundary=", headers=auth
    )
    assert broken.status_code == 400 and broken.json()["code"] == "bad_request"
    assert not Session.objects.exists()


def test_the_openapi_document_describes_both_bodies_on_one_operation(builtin: None) -> None:
    schema = Client().get("/api/v1/openapi.json").json()
    operation = schema["paths"][URL]["post"]
    assert operation["operationId"] == "createSession"
    content = operation["requestBody"]["content"]
    assert list(content) == ["application/json", "multipart/form-data"]
    assert content["application/json"]["schema"]["required"] == ["problem_type", "description"]
    form = content["multipart/form-data"]["schema"]
    # The bundle is left out only with sources=system (the API checks it, the schema says it).
    assert (
        "required" not in form and "sources=system" in form["properties"]["bundle"]["description"]
    )
    assert form["properties"]["bundle"] == {**form["properties"]["bundle"], "format": "binary"}
    fields = {"title", "description", "problem_type", "preferred_mode", "sources", "since", "until"}
    assert fields <= set(form["properties"])
    assert "Location" in operation["responses"]["201"]["headers"]
    assert "415" in operation["responses"]
    assert "Idempotency-Key" in str(operation["parameters"])
    assert URL + "/bundle" not in schema["paths"]
