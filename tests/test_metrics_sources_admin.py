"""Metrics sources as data in the admin (issue 36 item 1): a Prometheus base URL with its
password or token write-only and encrypted (each change audited, the value never), a
timeout, and "Test connection" answering in words: the version it found, or why not.
Only admins who may change sources test them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client

from aero.models import AuditLog
from packs.diagnosis.models import MetricsSource
from tests.admin_helpers import admin_client, form_data, staff_with
from tests.prometheus_helpers import fake_server, prometheus_with
from tests.servers import free_port

pytestmark = pytest.mark.services
CHANGELIST = "/admin/diagnosis_pack/metricssource/"
EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
BUILD = b'{"status":"success","data":{"version":"9.9.9"}}'


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser("root", password="pw-for-tests")


def press_test(client: Client, *rows: MetricsSource) -> list[str]:
    response = client.post(
        CHANGELIST,
        {"action": "test_sources", "_selected_action": [r.pk for r in rows]},
        follow=True,
    )
    assert response.status_code == 200
    return [str(m) for m in get_messages(response.wsgi_request)]


def add(client: Client, **fields: Any) -> Any:
    data = form_data(client.get(f"{CHANGELIST}add/").content.decode(), "metricssource_form")
    data.update(fields)
    return client.post(f"{CHANGELIST}add/", data)


def test_an_admin_adds_a_source_whose_token_is_sent_and_never_shown(root: User) -> None:
    client = admin_client(root)
    seen: list[dict[str, str]] = []
    with fake_server(200, BUILD, seen=seen) as url:
        response = add(client, name="shop", base_url=url, auth="bearer", secret="tok-very-secret-1")
        assert response.status_code == 302, response.content.decode()[:3000]
        row = MetricsSource.objects.get(name="shop")
        assert "tok-very-secret-1" not in row.secret_encrypted
        page = client.get(f"{CHANGELIST}{row.pk}/change/").content.decode()
        assert "tok-very-secret-1" not in page
        assert press_test(client, row) == [f"shop: Prometheus 9.9.9 at {url} answers queries"]
    assert {s["Authorization"] for s in seen} == {"Bearer tok-very-secret-1"}
    assert [s["path"].split("?")[0] for s in seen] == ["/api/v1/status/buildinfo", "/api/v1/query"]
    actions = list(AuditLog.objects.order_by("id").values_list("action", "detail"))
    assert [a for a, _ in actions if a.startswith("metrics_source.")] == [
        "metrics_source.enabled",
        "metrics_source.secret_set",
        "metrics_source.created",
        "metrics_source.tested",
    ]
    assert "tok-very-secret-1" not in str(actions)
    row.refresh_from_db()
    assert row.last_test_ok is True and "9.9.9" in row.last_test_message

    # Saved again with the box empty: kept; "remove" clears it (audited).
    data = form_data(
        client.get(f"{CHANGELIST}{row.pk}/change/").content.decode(), "metricssource_form"
    )
    data.update(auth="none")
    client.post(f"{CHANGELIST}{row.pk}/change/", data)
    row.refresh_from_db()
    assert row.secret_encrypted
    data.update(clear_secret="on")
    client.post(f"{CHANGELIST}{row.pk}/change/", data)
    row.refresh_from_db()
    assert row.secret_encrypted == ""
    assert AuditLog.objects.filter(action="metrics_source.secret_cleared").count() == 1


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"auth": "bearer", "secret": ""}, "A bearer token is needed."),
        ({"auth": "basic", "username": ""}, "Basic auth needs a user name."),
        ({"timeout_seconds": "0"}, "greater than or equal to 0.1"),
        ({"base_url": "not a url"}, "Enter a valid URL."),
    ],
)
def test_a_bad_source_is_refused_with_why_and_nothing_is_saved(
    root: User, fields: dict[str, str], error: str
) -> None:
    entered = {"name": "bad", "base_url": "http://127.0.0.1:9090", **fields}
    response = add(admin_client(root), **entered)
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not MetricsSource.objects.exists()


def test_the_test_connection_answers_with_the_version_or_why_not(
    root: User, tmp_path: Path
) -> None:
    from packs.diagnosis.bundle import open_bundle

    bundle = open_bundle(EXAMPLES / "ex-pool-inventory.tar.gz")
    down = MetricsSource.objects.create(
        name="down", base_url=f"http://127.0.0.1:{free_port()}", timeout_seconds=2
    )
    try:
        with prometheus_with(bundle.metrics_path, tmp_path) as url:
            live = MetricsSource.objects.create(name="live", base_url=url)
            said = press_test(admin_client(root), down, live)
    finally:
        bundle.close()
    assert said[0].startswith(f"down: Prometheus at {down.base_url} cannot be reached")
    assert said[1] == f"live: Prometheus 2.42.0+ds at {url} answers queries"
    listed = admin_client(root).get(CHANGELIST).content.decode()
    assert "answers: Prometheus 2.42.0+ds" in listed and "failed: Prometheus at" in listed
    tested = AuditLog.objects.filter(action="metrics_source.tested").order_by("id")
    assert [(t.detail["name"], t.detail["ok"]) for t in tested] == [("down", False), ("live", True)]


def test_only_admins_who_may_change_sources_test_them(db: None, make_user: Any) -> None:
    row = MetricsSource.objects.create(name="shop", base_url="http://127.0.0.1:9")
    olga = admin_client(make_user("olga", "operator"))
    refused = olga.post(CHANGELIST, {"action": "test_sources", "_selected_action": [row.pk]})
    assert refused.status_code == 302 and refused["Location"].startswith("/admin/login/")
    viewer = admin_client(staff_with("vic", "view_metricssource"))
    assert 'value="test_sources"' not in viewer.get(CHANGELIST).content.decode()
    press_test(viewer, row)
    assert not AuditLog.objects.filter(action="metrics_source.tested").exists()
    row.refresh_from_db()
    assert row.last_tested_at is None
