"""The IT diagnosis form and session page, as an on-call engineer uses them: a demo
incident or an uploaded bundle opens a session; its page shows the root cause, the
evidence it rests on and the fix waiting for an approver, in Chinese and English."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, override_settings
from django.urls import reverse

from diagnosis.models import Session
from tests.bundles import ONSET, BundleWriter
from tests.web_helpers import login, login_url

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
NEW = "diagnosis_pack:new"

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def open_page(client: Client, response: Any) -> str:
    assert response.status_code == 302, response.content.decode()[:2000]
    page = client.get(response["Location"])
    assert page.status_code == 200
    return str(page.content.decode())


def test_a_demo_incident_opens_a_session_whose_page_shows_cause_evidence_and_fix(
    builtin: None, alice: User
) -> None:
    client = login(alice)
    form = client.get(reverse(NEW)).content.decode()
    assert "ex-pool-inventory" in form and 'enctype="multipart/form-data"' in form

    page = open_page(client, client.post(reverse(NEW), {"demo": "ex-pool-inventory"}))

    hypothesis = 'title="db_pool_exhausted">database connection pool exhausted<'
    assert f'data-field="hypothesis" {hypothesis}' in page
    assert 'data-field="service">inventory<' in page
    assert "database connection pool of inventory is exhausted" in page
    # each evidence call with what it found, the ones the conclusion rests on marked
    assert 'data-tool="log_signatures"' in page and 'data-tool="anomalies"' in page
    assert "cited by the conclusion" in page
    assert "<td>inventory</td><td>db_connections_in_use</td>" not in page  # state, not an anomaly
    # the fix waits in the same approval queue as the airport's actions
    assert 'data-tool="restart_service"' in page
    assert "Restart the service" in page
    session = Session.objects.get()
    assert session.status == "waiting_user"
    assert session.scenario.kind == "diagnosis"


def test_an_uploaded_bundle_shows_the_blamed_deploy_and_its_code(
    builtin: None, alice: User
) -> None:
    client = login(alice)
    archive = (EXAMPLES / "ex-deploy-payments.tar.gz").read_bytes()
    upload = SimpleUploadedFile("incident.tar.gz", archive, content_type="application/gzip")

    page = open_page(
        client,
        client.post(
            reverse(NEW),
            {"bundle": upload, "problem_type": "error_spike", "preferred_mode": "react"},
        ),
    )

    assert 'data-field="deploy">D-5716<' in page
    assert "<code>payments/app/handlers.py:26</code>" in page
    assert 'data-testid="code-hunk">@@' in page
    assert 'data-tool="rollback_deploy"' in page


def test_the_session_page_speaks_chinese(builtin: None, alice: User) -> None:
    client = login(alice)
    client.post(reverse("set-language"), {"language": "zh-hans", "next": "/"})
    assert "新建 IT 故障诊断" in client.get(reverse(NEW)).content.decode()

    page = open_page(client, client.post(reverse(NEW), {"demo": "ex-upstream-cache"}))

    for chinese in ("根因", "证据", "置信度", "相关服务", "被结论引用", "向负责方提交工单"):
        assert chinese in page
    for english in ("Root cause", "Evidence", "Confidence", "cited by the conclusion"):
        assert english not in page


def test_a_bad_bundle_is_refused_with_where_and_opens_nothing(
    builtin: None, alice: User, tmp_path: Path
) -> None:
    writer = BundleWriter()
    writer.errors("orders", "boom ({n})", first=ONSET, count=10)
    root = writer.write(tmp_path / "bad")
    with (root / "metrics.csv").open("a") as metrics:
        metrics.write("2026-10-20T11:00:00+08:00,orders,up,high\n")
    archive = tmp_path / "bad.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="bad")
    upload = SimpleUploadedFile("bad.tar.gz", archive.read_bytes())

    response = login(alice).post(reverse(NEW), {"bundle": upload})

    assert response.status_code == 400
    error = response.content.decode()
    assert "The bundle is not valid: metrics.csv line" in error and "value" in error
    assert not Session.objects.exists()


@pytest.mark.parametrize("choice", ["neither", "both"])
def test_one_source_exactly(builtin: None, alice: User, choice: str) -> None:
    data: dict[str, Any] = {}
    if choice == "both":
        data = {
            "demo": "ex-pool-inventory",
            "bundle": SimpleUploadedFile("b.tar.gz", b"not an archive"),
        }
    response = login(alice).post(reverse(NEW), data)
    assert response.status_code == 400
    assert "Upload a bundle or choose a demo incident" in response.content.decode()
    assert not Session.objects.exists()


def test_who_may_open_a_diagnosis(builtin: None, bob: User, carol: User) -> None:
    url = reverse(NEW)
    assert Client().get(url)["Location"] == login_url(url)
    assert login(bob).post(url, {"demo": "ex-pool-inventory"}).status_code == 403
    assert login(carol).get(url).status_code == 403
    assert not Session.objects.exists()


def test_the_sessions_page_links_the_form(builtin: None, alice: User) -> None:
    page = login(alice).get(reverse("diagnosis:session-list")).content.decode()
    assert f'href="{reverse(NEW)}" data-testid="pack-form"' in page
    # the message form offers no diagnosis scenario: it needs evidence, not a sentence
    assert "it_diagnosis" not in page and "IT problem diagnosis</option>" not in page
