"""A small page where people create and revoke their own API tokens."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from aero.http import HtmxHttpRequest
from aero.models import audit
from aero.roles import ALL_ROLES, role_required
from api.forms import TokenForm
from api.models import ApiToken


def _page(
    request: HtmxHttpRequest, form: TokenForm, raw: str = "", status: int = 200
) -> HttpResponse:
    tokens = ApiToken.objects.filter(user_id=int(request.user.pk or 0)).order_by("-created_at")
    return render(
        request,
        "api/tokens.html",
        {"tokens": tokens, "form": form, "new_token": raw, "now": timezone.now()},
        status=status,
    )


@require_GET
@role_required(ALL_ROLES)
def token_list(request: HtmxHttpRequest) -> HttpResponse:
    return _page(request, TokenForm(user=request.user))


@require_POST
@role_required(ALL_ROLES)
def token_create(request: HtmxHttpRequest) -> HttpResponse:
    form = TokenForm(request.POST, user=request.user)
    if not form.is_valid():
        return _page(request, form, status=400)
    days = form.cleaned_data["expires_in_days"]
    token, raw = ApiToken.issue(
        request.user,
        form.cleaned_data["name"],
        form.cleaned_data["roles"],
        expires_at=timezone.now() + timedelta(days=days) if days else None,
    )
    audit(
        "api_token.created",
        obj=token,
        actor=request.user,
        detail={"name": token.name, "roles": token.roles, "prefix": token.prefix},
    )
    # Shown once, in this response only: never put in a message, a cookie or a log.
    response = _page(request, TokenForm(user=request.user), raw=raw, status=201)
    response["Cache-Control"] = "no-store"
    return response


@require_POST
@role_required(ALL_ROLES)
def token_revoke(request: HtmxHttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=token_id, user_id=int(request.user.pk or 0))
    if token.revoked_at is None:
        token.revoke()
        audit("api_token.revoked", obj=token, actor=request.user, detail={"name": token.name})
        messages.success(request, _("Token %(token)s revoked.") % {"token": token})
    return redirect("api-tokens:list")
