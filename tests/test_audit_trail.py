"""The audit trail: admin changes, provider switches and keys, roles, sign-in and out,
exports; and the /audit/ page auditors and admins read it on.

Personas: root (superuser), alice operates, bob approves, carol audits, dave no role."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from aero.models import AuditLog, audit
from packs.airport.models import Topology
from scenarios_admin.models import ProviderConfig, Scenario
from tests.admin_helpers import admin_client, form_data
from tests.web_helpers import approve_everything, login, make_session

AUDIT = "/audit/"
CSV = "/audit/export.csv"


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser("root", password="pw-for-tests")


def actions(**filters: Any) -> list[str]:
    return list(AuditLog.objects.filter(**filters).order_by("id").values_list("action", flat=True))


def admin_form(client: Client, url: str, form_id: str) -> dict[str, Any]:
    response = client.get(url)
    assert response.status_code == 200
    data = form_data(response.content.decode(), form_id)
    data["_save"] = "Save"
    return data


# --- what is recorded ------------------------------------------------------------------


@pytest.mark.services
def test_provider_creation_key_and_enable_are_audited_without_the_key(root: User) -> None:
    client = admin_client(root)
    add = "/admin/scenarios_admin/providerconfig/add/"
    data = admin_form(client, add, "providerconfig_form")
    data.update(
        name="deepseek", kind="openai", base_url="http://127.0.0.1:9/v1", model="m", enabled=""
    )
    data.pop("enabled")
    assert client.post(add, data).status_code == 302
    config = ProviderConfig.objects.get(name="deepseek")
    change = f"/admin/scenarios_admin/providerconfig/{config.pk}/change/"
    data = admin_form(client, change, "providerconfig_form")
    data.update(api_key="sk-very-secret-123", enabled="on")

    assert client.post(change, data).status_code == 302

    assert actions(object_type="scenarios_admin.providerconfig", object_id=str(config.pk)) == [
        "provider.created",
        "provider.enabled",
        "provider.key_set",
        "provider.changed",
    ]
    provider_entries = AuditLog.objects.filter(object_type="scenarios_admin.providerconfig")
    assert set(provider_entries.values_list("actor_label", flat=True)) == {"root"}
    config.refresh_from_db()
    assert config.api_key_encrypted
    stored = " ".join(str(e.detail) for e in AuditLog.objects.all())
    assert "sk-very-secret-123" not in stored
    assert config.api_key_encrypted not in stored


@pytest.mark.services
def test_a_scenario_draft_save_names_who_saved_it(builtin: None, root: User) -> None:
    scenario = Scenario.objects.get(slug="oil_spill")
    client = admin_client(root)
    url = f"/admin/scenarios_admin/scenario/{scenario.pk}/change/"
    data = admin_form(client, url, "scenario_form")
    data["name_en"] = "Apron fluid spill (edited)"

    assert client.post(url, data).status_code == 302

    entry = AuditLog.objects.get(action="scenario.draft_saved")
    assert (entry.actor, entry.object_id) == (root, str(scenario.pk))
    assert "Name en" in entry.detail["changes"] or "name" in entry.detail["changes"].lower()


@pytest.mark.services
def test_a_topology_edit_is_audited(builtin: None, root: User) -> None:
    topology = Topology.objects.get()
    client = admin_client(root)
    url = f"/admin/airport/topology/{topology.pk}/change/"
    data = admin_form(client, url, "topology_form")
    data["name"] = "Demo airport (renamed)"

    assert client.post(url, data).status_code == 302

    entry = AuditLog.objects.get(action="topology.changed")
    assert entry.actor == root and entry.object_id == str(topology.pk)


@pytest.mark.services
def test_users_roles_and_privileges_are_audited(root: User) -> None:
    for name in ("operator", "approver"):
        Group.objects.get_or_create(name=name)
    client = admin_client(root)
    add = "/admin/auth/user/add/"
    data = admin_form(client, add, "user_form")
    data.update(username="erin", password1="a-long-pass-phrase-9", password2="a-long-pass-phrase-9")
    assert client.post(add, data).status_code == 302
    erin = User.objects.get(username="erin")
    change = f"/admin/auth/user/{erin.pk}/change/"
    data = admin_form(client, change, "user_form")
    data["groups"] = [str(Group.objects.get(name="approver").pk)]
    data["is_staff"] = "on"

    assert client.post(change, data).status_code == 302

    assert actions(object_type="auth.user", object_id=str(erin.pk)) == [
        "user.created",
        "user.privileges_changed",
        "user.roles_changed",
        "user.changed",
    ]
    roles = AuditLog.objects.get(action="user.roles_changed")
    assert roles.actor == root and roles.detail == {"user": "erin", "added": ["approver"]}
    privileges = AuditLog.objects.get(action="user.privileges_changed", object_id=str(erin.pk))
    assert privileges.detail["changed"] == {"is_staff": [False, True]}

    # Outside a request (a shell, a command) the actor is "system".
    erin.groups.clear()
    cleared = AuditLog.objects.filter(action="user.roles_changed").latest("id")
    assert cleared.actor_label == "system" and cleared.detail["removed"] == ["approver"]


@pytest.mark.services
def test_sign_in_sign_out_and_failed_sign_in(db: None) -> None:
    User.objects.create_user("erin", password="right-password-1")
    client = Client(REMOTE_ADDR="192.0.2.7")

    client.post(reverse("login"), {"username": "erin", "password": "wrong-password-1"})
    client.post(reverse("login"), {"username": "erin", "password": "right-password-1"})
    client.post(reverse("logout"))

    assert actions() == ["auth.sign_in_failed", "auth.signed_in", "auth.signed_out"]
    failed, signed_in, signed_out = AuditLog.objects.order_by("id")
    assert (failed.actor_label, failed.object_id) == ("anonymous", "erin")
    assert failed.detail == {"username": "erin", "address": "192.0.2.7"}
    assert "wrong-password-1" not in str(failed.detail)
    assert signed_in.actor_label == "erin" and signed_out.actor_label == "erin"


@pytest.mark.services
def test_downloading_a_report_is_audited(
    builtin: None, alice: User, bob: User, carol: User
) -> None:
    session = make_session(alice)
    approve_everything(session, bob)
    assert session.status == "completed"

    response = login(carol).get(reverse("diagnosis:session-report", args=[session.pk]))

    assert response.status_code == 200
    entry = AuditLog.objects.get(action="report.exported")
    assert entry.actor == carol and entry.session_id == session.pk


# --- the /audit/ page -------------------------------------------------------------------


@pytest.fixture
def entries(db: None) -> None:
    audit("approval.approved", actor_label="bob", object_type="approvals.approval", object_id="7")
    audit("approval.rejected", actor_label="bob", object_type="approvals.approval", object_id="8")
    audit("provider.key_set", actor_label="root", object_type="scenarios_admin.providerconfig")
    audit("auth.signed_in", actor_label='=HYPERLINK("http://x")', detail={"note": "@SUM(1)"})


def newest_first() -> list[str]:
    return [
        str(pk)
        for pk in AuditLog.objects.order_by("-created_at", "-id").values_list("pk", flat=True)
    ]


def page_rows(response: Any) -> list[str]:
    body = response.content.decode()
    return [part.split('"')[0] for part in body.split('<tr data-entry="')[1:]]


def login_as(user: User | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


@pytest.mark.services
def test_anonymous_is_sent_to_sign_in(db: None) -> None:
    for url in (AUDIT, CSV):
        response = login_as(None).get(url)
        assert response.status_code == 302
        assert response["Location"] == f"{reverse('login')}?next={url}"


@pytest.mark.services
@pytest.mark.parametrize("persona", ["alice", "bob", "dave"])
def test_operators_approvers_and_users_without_role_are_refused(
    persona: str, request: pytest.FixtureRequest
) -> None:
    user = request.getfixturevalue(persona)
    for url in (AUDIT, CSV):
        assert login_as(user).get(url).status_code == 403
    assert not AuditLog.objects.filter(action="audit.exported").exists()


@pytest.mark.services
@pytest.mark.parametrize("persona", ["carol", "root"])
def test_auditors_and_admins_read_the_log(
    entries: None, persona: str, request: pytest.FixtureRequest
) -> None:
    response = login_as(request.getfixturevalue(persona)).get(AUDIT)

    assert response.status_code == 200
    # the four entries, the persona's creation and sign-in among them
    assert page_rows(response) == newest_first()
    assert len(page_rows(response)) >= 5
    assert "approvals.approval:7" in response.content.decode()


@pytest.mark.services
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"actor": "BOB"}, ["approval.rejected", "approval.approved"]),
        ({"action": "approval."}, ["approval.rejected", "approval.approved"]),
        ({"action": "provider.key_set"}, ["provider.key_set"]),
        ({"object": "approvals.approval:8"}, ["approval.rejected"]),
        ({"object": "scenarios_admin.providerconfig"}, ["provider.key_set"]),
        ({"actor": "bob", "object": "7"}, ["approval.approved"]),
    ],
)
def test_filters(entries: None, carol: User, query: dict[str, str], expected: list[str]) -> None:
    response = login_as(carol).get(AUDIT, query)

    shown = [AuditLog.objects.get(pk=pk).action for pk in page_rows(response)]
    assert shown == expected


@pytest.mark.services
def test_date_filters(entries: None, carol: User) -> None:
    today = timezone.localdate()
    client = login_as(carol)

    day = {"date_from": str(today), "date_to": str(today)}
    assert page_rows(client.get(AUDIT, day)) == newest_first()
    response = client.get(AUDIT, {"date_from": str(today + timedelta(days=1))})
    assert page_rows(response) == []
    assert "No entry matches these filters." in response.content.decode()


@pytest.mark.services
@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"date_from": "2026-02-30"}, "Enter a valid date."),
        ({"date_from": "2026-03-02", "date_to": "2026-03-01"}, "before the start date"),
        ({"after": "not-a-cursor"}, "This page link is broken"),
    ],
)
def test_bad_filters_say_what_is_wrong(carol: User, query: dict[str, str], message: str) -> None:
    response = login_as(carol).get(AUDIT, query)

    assert response.status_code == 400
    assert message in response.content.decode()


@pytest.mark.services
def test_keyset_pages_cover_every_entry_once(
    carol: User, django_assert_max_num_queries: Callable[..., Any]
) -> None:
    for n in range(120):
        audit("test.recorded", actor_label="pytest", object_type="thing", object_id=str(n))
    client = login_as(carol)
    seen: list[str] = []
    url: str | None = AUDIT + "?action=test."
    pages = 0
    while url:
        with django_assert_max_num_queries(6):
            response = client.get(url)
        rows = page_rows(response)
        seen.extend(rows)
        pages += 1
        body = response.content.decode()
        url = None
        if 'rel="next"' in body:
            href = body.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
            url = href.replace("&amp;", "&")
    assert pages == 3
    expected = [
        str(pk)
        for pk in AuditLog.objects.filter(action="test.recorded")
        .order_by("-created_at", "-id")
        .values_list("pk", flat=True)
    ]
    assert seen == expected


@pytest.mark.services
def test_csv_download_is_injection_safe_filtered_and_audited(entries: None, carol: User) -> None:
    response = login_as(carol).get(CSV)

    assert response.status_code == 200
    assert response["Content-Disposition"].startswith('attachment; filename="aero-audit-')
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    rows = list(csv.reader(io.StringIO(body)))
    assert rows[0] == [
        "time",
        "actor",
        "action",
        "object_type",
        "object_id",
        "session",
        "detail",
        "digest",
    ]
    assert [r[4] for r in rows[1:]] == [
        e.object_id for e in AuditLog.objects.order_by("-created_at", "-id")
    ]
    signed_in = next(r for r in rows if r[2] == "auth.signed_in" and "HYPERLINK" in r[1])
    assert signed_in[1] == '\'=HYPERLINK("http://x")'
    assert signed_in[6] == '{"note": "@SUM(1)"}'  # JSON starts with "{": nothing to run
    for row in rows[1:]:
        assert not any(cell.startswith(("=", "+", "-", "@")) for cell in row)
    entry = AuditLog.objects.get(action="audit.exported")
    assert entry.actor == carol

    filtered = login_as(carol).get(CSV, {"actor": "bob"})
    lines = b"".join(filtered.streaming_content).decode().strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 + 2
    assert AuditLog.objects.filter(action="audit.exported").latest("id").detail == {"actor": "bob"}
