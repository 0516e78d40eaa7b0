"""A diagnosis session's stored bundle leaves AERO as a zip, from the session page and
`GET /api/v1/diagnosis-sessions/{id}/bundle`, for those who read the session unmasked
only (it is raw data), audited, and gone with the session's soft delete."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from aero.models import AuditLog
from diagnosis.actions import do_delete_session
from diagnosis.models import Session
from packs.diagnosis.sessions import start_from_bundle
from packs.diagnosis.storage import bundle_dir
from tests.api_helpers import call, token_for
from tests.web_helpers import login, login_url, waiting_session

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
API = "/api/v1/diagnosis-sessions"

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


@pytest.fixture
def diagnosed(builtin: None, alice: User) -> Session:
    session = start_from_bundle(alice, EXAMPLES / "ex-deploy-payments.tar.gz", {})
    session.refresh_from_db()
    return session


def stored(session: Session) -> dict[str, bytes]:
    root = bundle_dir(session.pk)
    return {
        f"bundle-{session.pk}/{p.relative_to(root).as_posix()}": p.read_bytes()
        for p in root.rglob("*")
        if p.is_file()
    }


def unzipped(response: Any) -> dict[str, bytes]:
    assert response.status_code == 200
    assert response["Content-Type"] == "application/zip"
    assert response.streaming, "sent as it is read, never built whole in memory"
    body = b"".join(response.streaming_content)
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        assert archive.testzip() is None
        return {name: archive.read(name) for name in archive.namelist()}


def test_the_page_offers_the_bundle_as_a_zip_to_those_who_read_it_unmasked(
    diagnosed: Session, alice: User, bob: User, carol: User, dave: User
) -> None:
    page = login(alice).get(reverse("diagnosis:session-detail", args=[diagnosed.pk]))
    link = reverse("diagnosis_pack:bundle", args=[diagnosed.pk])
    assert f'href="{link}"' in page.content.decode()
    files = unzipped(login(alice).get(link))
    # every file of the bundle, byte for byte: the incident, logs, metrics, the git repo
    assert files == stored(diagnosed)
    assert f"bundle-{diagnosed.pk}/incident.yaml" in files
    assert any("/repo/.git/" in name for name in files)
    entry = AuditLog.objects.get(action="session.bundle_downloaded", actor=alice)
    assert entry.session_id == diagnosed.pk
    assert entry.detail["files"] == len(files) and entry.detail["via"] == "web"
    assert unzipped(login(bob).get(link)) == files  # an approver reads it unmasked too

    # an auditor reads the session masked: no link, and the raw bundle is refused
    auditor_page = login(carol).get(reverse("diagnosis:session-detail", args=[diagnosed.pk]))
    assert auditor_page.status_code == 200 and link not in auditor_page.content.decode()
    refused = login(carol).get(link)
    assert refused.status_code == 403
    assert "raw data" in refused.content.decode()
    assert login(dave).get(link).status_code == 403  # no role at all
    chinese = login(alice)
    chinese.post(reverse("set-language"), {"language": "zh-hans", "next": "/"})
    page_zh = chinese.get(reverse("diagnosis:session-detail", args=[diagnosed.pk])).content
    assert "下载事件包（压缩包）" in page_zh.decode()
    carol_zh = login(carol)
    carol_zh.post(reverse("set-language"), {"language": "zh-hans", "next": "/"})
    assert "未经脱敏的原始数据" in carol_zh.get(link).content.decode()
    signed_out = login(None).get(link)
    assert signed_out.status_code == 302 and signed_out["Location"] == login_url(link)
    assert AuditLog.objects.filter(action="session.bundle_downloaded").count() == 2


def test_the_api_serves_the_bundle_with_the_sessions_access(
    diagnosed: Session, alice: User, carol: User, dave: User, make_user: Any
) -> None:
    url = f"{API}/{diagnosed.pk}/bundle"
    files = unzipped(call("GET", url, token_for(alice)))
    assert files == stored(diagnosed)
    assert AuditLog.objects.get(action="session.bundle_downloaded").detail["via"] == "api"

    assert call("GET", url).status_code == 401
    for token in (token_for(carol), token_for(dave)):
        refused = call("GET", url, token)
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    # a token held to the auditor's role reads masked, whoever holds it
    admin = make_user("root", "admin")
    assert call("GET", url, token_for(admin, "auditor")).status_code == 403
    assert AuditLog.objects.filter(action="session.bundle_downloaded").count() == 1

    assert call("GET", f"{API}/{uuid4()}/bundle", token_for(alice)).json()["code"] == "not_found"
    # an apron session was not started from a bundle
    apron = waiting_session(alice)
    none = call("GET", f"{API}/{apron.pk}/bundle", token_for(alice))
    assert none.status_code == 404 and none.json()["code"] == "no_bundle"
    assert login(alice).get(reverse("diagnosis_pack:bundle", args=[apron.pk])).status_code == 404


def test_a_deleted_sessions_bundle_is_gone_from_both(
    diagnosed: Session, alice: User, make_user: Any
) -> None:
    admin = make_user("root", "admin")
    link = reverse("diagnosis_pack:bundle", args=[diagnosed.pk])
    assert login(admin).get(link).status_code == 200
    do_delete_session(diagnosed.pk, admin, "test data")
    # the soft delete removes the stored copy (DomainPack.on_deleted): nothing to serve
    assert not bundle_dir(diagnosed.pk).exists()
    assert login(admin).get(link).status_code == 404
    gone = call("GET", f"{API}/{diagnosed.pk}/bundle", token_for(admin))
    assert gone.status_code == 404 and gone.json()["code"] == "not_found"


def test_the_bundle_is_in_the_openapi_document(db: None) -> None:
    schema = call("GET", "/api/v1/openapi.json").json()
    operation = schema["paths"]["/api/v1/diagnosis-sessions/{session_id}/bundle"]["get"]
    assert operation["operationId"] == "getSessionBundle"
    assert operation["responses"]["200"]["content"]["application/zip"]["schema"] == {
        "type": "string",
        "format": "binary",
    }
    assert {"401", "403", "404"} <= set(operation["responses"])
