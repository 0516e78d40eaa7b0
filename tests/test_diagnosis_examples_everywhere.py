"""The three shipped example incidents give exactly their expected root cause, service,
deploy, code location and fix action (expected.yaml) however a person opens them: the
command (tests/test_diagnosis_sessions.py), the web form's demo choice, and an upload to
the API. The answer read is the API's own report of the session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse

from diagnosis.models import Session
from tests.api_helpers import token_for
from tests.web_helpers import login

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
EXPECTED = yaml.safe_load((EXAMPLES / "expected.yaml").read_text("utf-8"))

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def opened_on_the_web(user: User, name: str) -> str:
    response = login(user).post(reverse("diagnosis_pack:new"), {"demo": name})
    assert response.status_code == 302, response.content.decode()[:2000]
    return str(Session.objects.get().pk)


def opened_through_the_api(token: str, name: str) -> str:
    with (EXAMPLES / f"{name}.tar.gz").open("rb") as bundle:
        response = Client().post(
            "/api/v1/diagnosis-sessions",  # the create operation's multipart body
            {"bundle": bundle},
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": f"ex-{name}"},
        )
    assert response.status_code == 201, response.content
    return str(response.json()["session_id"])


@pytest.mark.parametrize("channel", ["web", "api"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_example_concludes_as_expected_from_the_form_and_the_api(
    builtin: None, alice: User, name: str, channel: str
) -> None:
    expected = EXPECTED[name]
    token = token_for(alice, "operator")
    session_id = (
        opened_on_the_web(alice, name) if channel == "web" else opened_through_the_api(token, name)
    )
    got = Client().get(
        f"/api/v1/diagnosis-sessions/{session_id}", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert got.status_code == 200
    body = got.json()
    cause = body["snapshot"]["root_cause"]
    assert (cause["hypothesis"], cause["service"]) == (expected["hypothesis"], expected["service"])
    assert cause.get("deploy") == expected.get("deploy")
    locations = [(c["path"], c["line"]) for c in body["report"]["code_locations"]]
    if "code_path" in expected:
        assert locations[0] == (expected["code_path"], expected["code_line"])
    else:
        assert locations == []
    # the fix waits for its approver: what the log says was asked
    timeline = Client().get(
        f"/api/v1/diagnosis-sessions/{session_id}/timeline",
        {"limit": 200},  # a whole diagnosis
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert timeline.status_code == 200 and timeline.json()["next_cursor"] is None
    fixes = [
        (e["payload"]["tool_name"], e["payload"]["args"]["service"], e["payload"]["risk_level"])
        for e in timeline.json()["events"]
        if e["type"] == "approval.required"
    ]
    action = expected["action"]
    assert fixes == [(action["tool"], action["service"], action["risk_class"])]
