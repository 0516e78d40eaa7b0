"""Skills through the admin and the API: an admin uploads a zip on the admin's add page
(a refused zip is a form error naming why, nothing kept), sees its versions and chooses
the active one (audited); /api/v1/skills/upload, /skills and /skills/{id}/versions answer
admins only, a refused zip is a 422 with its reason's code, a retried upload with its
Idempotency-Key answers the first again without keeping a second."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from aero.models import AuditLog
from tests.admin_helpers import admin_client
from tests.api_helpers import token_for
from tests.skill_helpers import COUNT_ERRORS, skill_zip
from tools.models import Skill, SkillVersion

pytestmark = pytest.mark.services
ADD = "/admin/tools/skill/add/"


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser("root", password="pw-for-tests")


def upload(token: str | None, data: bytes, key: str = "", **fields: Any) -> Any:
    headers: dict[str, Any] = {}
    if token:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    if key:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    body = {"file": SimpleUploadedFile("skill.zip", data, "application/zip"), **fields}
    return Client().post("/api/v1/skills/upload", body, **headers)


# --- the admin ----------------------------------------------------------------------------


def test_an_admin_uploads_a_skill_and_chooses_its_active_version(root: User) -> None:
    client = admin_client(root)
    page = client.get(ADD).content.decode()
    assert 'name="file"' in page and 'enctype="multipart/form-data"' in page
    zip_file = SimpleUploadedFile("s.zip", skill_zip(COUNT_ERRORS), "application/zip")
    done = client.post(ADD, {"file": zip_file}, follow=True)
    assert "Uploaded count-errors version 1.0." in done.content.decode()
    skill = Skill.objects.get()
    newer = SimpleUploadedFile("s.zip", skill_zip(COUNT_ERRORS, version="2.0"), "application/zip")
    client.post(ADD, {"file": newer})
    change = client.get(f"/admin/tools/skill/{skill.pk}/change/").content.decode()
    assert "2.0" in change and "main.py, skill.yaml" in change
    second = SkillVersion.objects.get(version="2.0")
    client.post(f"/admin/tools/skill/{skill.pk}/change/", {"active_version": second.pk, **INLINE})
    skill.refresh_from_db()
    assert skill.active_version == second
    activated = AuditLog.objects.filter(action="skill.activated").order_by("pk").last()
    assert activated is not None and activated.detail["version"] == "2.0"
    assert activated.detail["before"] == "1.0" and activated.actor == root
    assert AuditLog.objects.filter(action="skill.changed").exists()


INLINE = {
    "versions-TOTAL_FORMS": "0",
    "versions-INITIAL_FORMS": "0",
    "versions-MIN_NUM_FORMS": "0",
    "versions-MAX_NUM_FORMS": "1000",
}


def test_a_refused_zip_is_a_form_error_and_nothing_is_kept(root: User) -> None:
    client = admin_client(root)
    bad = SimpleUploadedFile(
        "s.zip", skill_zip(COUNT_ERRORS, files={"../x.py": b"1"}), "application/zip"
    )
    page = client.post(ADD, {"file": bad}).content.decode()
    assert "a path leaving the skill&#x27;s folder (unsafe_path)" in page
    assert "Nothing was kept." in page
    assert not Skill.objects.exists()


# --- the API ------------------------------------------------------------------------------


def test_an_upload_through_the_api_lists_with_its_versions(root: User) -> None:
    token = token_for(root, "admin")
    created = upload(token, skill_zip(COUNT_ERRORS, applies_to=["db_pool_exhaustion"]))
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["skill"]["tool"] == "skill:count-errors"
    assert body["skill"]["active_version"] == "1.0" and body["skill"]["risk_class"] == "R0"
    assert body["version"]["applies_to"] == ["db_pool_exhaustion"]
    assert body["version"]["files"] == ["main.py", "skill.yaml"]
    later = upload(token, skill_zip(COUNT_ERRORS, version="1.1", risk="R1"), activate="true")
    assert later.status_code == 201 and later.json()["skill"]["risk_class"] == "R1"
    listed = Client().get("/api/v1/skills", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert [(s["name"], s["active_version"], s["versions"]) for s in listed["skills"]] == [
        ("count-errors", "1.1", 2)
    ]
    skill_id = listed["skills"][0]["id"]
    versions = Client().get(
        f"/api/v1/skills/{skill_id}/versions", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert [(v["version"], v["active"]) for v in versions.json()["versions"]] == [
        ("1.1", True),
        ("1.0", False),
    ]
    missing = Client().get("/api/v1/skills/999999/versions", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert missing.status_code == 404


def test_a_refused_zip_is_a_422_naming_why(root: User) -> None:
    token = token_for(root, "admin")
    bomb = skill_zip(COUNT_ERRORS, files={"zeros.bin": b"\0" * (3 * 1024 * 1024)})
    refused = upload(token, bomb)
    assert refused.status_code == 422
    assert refused["Content-Type"] == "application/problem+json"
    assert refused.json()["code"] == "zip_bomb" and "zeros.bin" in refused.json()["detail"]
    upload(token, skill_zip(COUNT_ERRORS))
    again = upload(token, skill_zip(COUNT_ERRORS))
    assert again.status_code == 422 and again.json()["code"] == "duplicate_version"
    assert SkillVersion.objects.count() == 1


def test_a_retried_upload_with_its_key_is_answered_again(root: User) -> None:
    token = token_for(root, "admin")
    data = skill_zip(COUNT_ERRORS)
    first = upload(token, data, key="skill-1")
    again = upload(token, data, key="skill-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert SkillVersion.objects.count() == 1
    assert AuditLog.objects.filter(action="skill.uploaded").count() == 1
    other = upload(token, skill_zip(COUNT_ERRORS, version="9"), key="skill-1")
    assert other.status_code == 422


def test_skills_are_for_admins_only(root: User, make_user: Any) -> None:
    for role in ("operator", "approver", "auditor"):
        user = make_user(f"u-{role}", role)
        token = token_for(user, role)
        refused = upload(token, skill_zip(COUNT_ERRORS))
        assert refused.status_code == 403 and "manage skills" in refused.json()["detail"]
        listed = Client().get("/api/v1/skills", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert listed.status_code == 403
    assert upload(None, skill_zip(COUNT_ERRORS)).status_code == 401
    assert not Skill.objects.exists()


def test_the_operations_are_in_the_openapi_document(db: None) -> None:
    paths = Client().get("/api/v1/openapi.json").json()["paths"]
    upload_op = paths["/api/v1/skills/upload"]["post"]
    assert upload_op["operationId"] == "uploadSkill"
    assert "Idempotency-Key" in [p["name"] for p in upload_op["parameters"]]
    assert "multipart/form-data" in upload_op["requestBody"]["content"]
    assert paths["/api/v1/skills"]["get"]["operationId"] == "listSkills"
    assert paths["/api/v1/skills/{skill_id}/versions"]["get"]["operationId"] == "listSkillVersions"


# Seed 003 §4.1.4's operations for tools and models: each in the OpenAPI document,
# admin only (a 403 documented; tests/test_access_table.py denies every other role),
# and the POSTs (an upload creates, a test acts) take an Idempotency-Key.
SEED_OPERATIONS = (
    ("post", "/api/v1/skills/upload", "api:upload_skill"),
    ("get", "/api/v1/skills", "api:list_skills"),
    ("get", "/api/v1/skills/{skill_id}/versions", "api:list_skill_versions"),
    ("get", "/api/v1/mcp/servers", "api:list_mcp_servers"),
    ("post", "/api/v1/mcp/servers/test", "api:test_mcp_server"),
    ("get", "/api/v1/llm/models", "api:list_llm_models"),
)


def test_every_seed_operation_is_documented_admin_only_and_idempotent_where_it_posts(
    db: None,
) -> None:
    from tests.test_access_table import ADM, ANON, APP, AUD, OP, TOKEN_URLS

    paths = Client().get("/api/v1/openapi.json").json()["paths"]
    for method, path, name in SEED_OPERATIONS:
        operation = paths[path][method]
        assert "403" in operation["responses"] and operation.get("security"), path
        params = [p["name"] for p in operation.get("parameters", [])]
        assert ("Idempotency-Key" in params) == (method == "post"), path
        # anonymous 401; operator, approver and auditor refused; only the admin gets in
        expected = TOKEN_URLS[name][1]
        assert expected[ANON] == 401, name
        assert {expected[OP], expected[APP], expected[AUD]} == {403}, name
        assert expected[ADM] not in (401, 403), name
