from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from aero.models import audit
from aero.roles import ALL_ROLES
from api.models import ApiToken


class ApiTokenAddForm(forms.ModelForm[ApiToken]):
    roles = forms.MultipleChoiceField(
        choices=[(r, r) for r in ALL_ROLES],
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: all of the user's roles.",
    )

    class Meta:
        model = ApiToken
        fields = ["user", "name", "roles", "expires_at"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin[ApiToken]):
    list_display = ["name", "user", "prefix", "roles", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__username", "prefix"]
    actions = ["revoke_tokens"]

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "user":
            # A token acts as its user: an admin minting one for someone else could be
            # that person, and so the second person of the two-person rule. Admins
            # issue tokens for themselves; they may revoke anyone's.
            kwargs["queryset"] = get_user_model().objects.filter(pk=request.user.pk or 0)
            kwargs["initial"] = request.user.pk
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = ApiTokenAddForm
        return super().get_form(request, obj, change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        # A token's identity never changes: revoke it and issue another.
        return [
            "user",
            "name",
            "prefix",
            "roles",
            "created_at",
            "expires_at",
            "last_used_at",
            "revoked_at",
        ]

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ["user", "name", "roles", "expires_at"]
        return self.get_readonly_fields(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoked tokens stay, so audit entries keep naming a real token

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            return
        if form.cleaned_data["user"].pk != request.user.pk:
            raise PermissionDenied("an admin issues API tokens for themselves only")
        token, raw = ApiToken.issue(
            form.cleaned_data["user"],
            form.cleaned_data["name"],
            form.cleaned_data["roles"],
            expires_at=form.cleaned_data["expires_at"],
        )
        obj.pk = token.pk
        request._aero_new_token = raw  # type: ignore[attr-defined]
        audit(
            "api_token.created",
            obj=token,
            actor=request.user,
            detail={"name": token.name, "roles": token.roles, "for": token.user.get_username()},
        )

    def response_add(
        self, request: HttpRequest, obj: ApiToken, post_url_continue: Any = None
    ) -> HttpResponse:
        # The token is shown once on this page, never stored in a message or cookie.
        token = ApiToken.objects.get(pk=obj.pk)
        response = TemplateResponse(
            request,
            "admin/api/token_created.html",
            {
                **self.admin_site.each_context(request),
                "token": token,
                "raw": getattr(request, "_aero_new_token", ""),
                "opts": self.model._meta,
                "title": "API token created",
            },
        )
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected tokens")
    def revoke_tokens(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        count = 0
        for token in queryset.filter(revoked_at__isnull=True):
            token.revoke()
            audit("api_token.revoked", obj=token, actor=request.user, detail={"name": token.name})
            count += 1
        self.message_user(request, f"{count} token(s) revoked.")
