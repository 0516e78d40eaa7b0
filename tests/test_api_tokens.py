"""API tokens are created and revoked by their owners on /api/tokens/ and by admins in the
admin; only a hash is stored and the token is shown once."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from aero.models import AuditLog
from api.models import ApiToken, hash_token
from tests.api_helpers import call
from tests.web_helpers import login, login_url

TOKEN = re.compile(r'<code id="new-token-value"[^>]*>(aero_[^<]+)</code>')


def test_create_use_and_revoke_a_token_on_the_page(db: None, alice: User) -> None:
    client = login(alice)
    page = client.get("/api/tokens/")
    assert page.status_code == 200 and "No tokens yet." in page.content.decode()

    created = client.post("/api/tokens/new/", {"name": "ci pipeline", "expires_in_days": "30"})
    assert created.status_code == 201
    assert created["Cache-Control"] == "no-store"
    raw = TOKEN.findall(created.content.decode())[0]
    token = ApiToken.objects.get(user=alice)
    assert token.token_hash == hash_token(raw) and token.name == "ci pipeline"
    assert token.expires_at is not None and token.roles == []
    assert call("GET", "/api/v1/approvals/1", raw).status_code == 404  # works, nothing there

    listing = client.get("/api/tokens/").content.decode()
    assert raw not in listing, "shown once"
    assert token.prefix in listing and "active" in listing

    revoked = client.post(f"/api/tokens/{token.pk}/revoke/")
    assert revoked.status_code == 302
    assert call("GET", "/api/v1/approvals/1", raw).status_code == 401
    assert "revoked" in client.get("/api/tokens/").content.decode()
    actions = list(
        AuditLog.objects.filter(action__startswith="api_token.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["api_token.created", "api_token.revoked"]


def test_roles_offered_are_the_users_own(db: None, make_user: Callable[..., User]) -> None:
    both = make_user("olga", "operator", "approver")
    client = login(both)
    page = client.get("/api/tokens/").content.decode()
    assert 'value="operator"' in page and 'value="approver"' in page
    assert 'value="admin"' not in page
    refused = client.post("/api/tokens/new/", {"name": "x", "roles": ["admin"]})
    assert refused.status_code == 400
    assert not ApiToken.objects.exists()
    client.post("/api/tokens/new/", {"name": "x", "roles": ["approver"]})
    assert ApiToken.objects.get().roles == ["approver"]


def test_token_pages_refuse_strangers(
    db: None, alice: User, dave: User, make_user: Callable[..., User]
) -> None:
    assert Client().get("/api/tokens/")["Location"] == login_url("/api/tokens/")
    assert Client().post("/api/tokens/new/", {"name": "x"}).status_code == 302
    assert login(dave).get("/api/tokens/").status_code == 403
    assert login(dave).post("/api/tokens/new/", {"name": "x"}).status_code == 403
    token, _ = ApiToken.issue(alice, "mine")
    # another user cannot revoke it, nor learn that it exists
    assert login(dave).post(f"/api/tokens/{token.pk}/revoke/").status_code == 403
    erin = make_user("erin", "operator")
    assert login(erin).post(f"/api/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None
    assert login(alice).get(f"/api/tokens/{token.pk}/revoke/").status_code == 405


@pytest.mark.services
def test_admins_issue_their_own_tokens_and_revoke_anyones_in_the_admin(
    db: None, admin_client: Client, admin_user: User, alice: User
) -> None:
    # A token for alice would let the admin act as alice (the second person of the
    # two-person rule, say): refused.
    for_alice = admin_client.post(
        "/admin/api/apitoken/add/", {"user": alice.pk, "name": "for alice", "roles": []}
    )
    assert for_alice.status_code == 200 and not TOKEN.findall(for_alice.content.decode())
    assert not ApiToken.objects.filter(user=alice).exists()

    response = admin_client.post(
        "/admin/api/apitoken/add/",
        {"user": admin_user.pk, "name": "from admin", "roles": ["auditor"]},
    )
    assert response.status_code == 200
    raw = TOKEN.findall(response.content.decode())[0]
    token = ApiToken.objects.get(name="from admin")
    assert token.user == admin_user and token.token_hash == hash_token(raw)
    assert token.roles == ["auditor"]
    assert raw not in admin_client.get("/admin/api/apitoken/").content.decode()

    alices, _ = ApiToken.issue(alice, "alice's own", [])
    admin_client.post(
        "/admin/api/apitoken/",
        {"action": "revoke_tokens", "_selected_action": [token.pk, alices.pk]},
    )
    for revoked in (token, alices):
        revoked.refresh_from_db()
        assert revoked.revoked_at is not None
        assert AuditLog.objects.filter(
            action="api_token.revoked", object_id=str(revoked.pk)
        ).exists()
