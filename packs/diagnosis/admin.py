from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from aero.admin_base import ReadOnlyAdmin
from aero.models import audit
from packs.diagnosis.models import (
    KnowledgeItem,
    MetricsAuth,
    MetricsSource,
    SimilarCase,
    SystemSources,
)
from packs.diagnosis.sources import probe_source


@admin.register(KnowledgeItem)
class KnowledgeItemAdmin(admin.ModelAdmin[KnowledgeItem]):
    list_display = ["key", "title_zh", "title_en", "problem_type", "hypothesis", "source"]
    list_filter = ["source", "problem_type", "hypothesis"]
    search_fields = ["key", "title_zh", "title_en", "search_text"]
    readonly_fields = ["source", "session", "created_by", "created_at", "updated_at"]
    fieldsets = [
        (None, {"fields": ["key", "title_zh", "title_en", "problem_type", "hypothesis"]}),
        (None, {"fields": ["services", "tags"]}),
        (None, {"fields": ["symptoms_zh", "symptoms_en", "root_cause_zh", "root_cause_en"]}),
        (None, {"fields": ["fix_zh", "fix_en"]}),
        (None, {"fields": ["source", "session", "created_by", "created_at", "updated_at"]}),
    ]

    def save_model(self, request: HttpRequest, obj: KnowledgeItem, form: Any, change: bool) -> None:
        if not change:
            obj.created_by = request.user  # type: ignore[assignment]
        super().save_model(request, obj, form, change)
        audit(
            "knowledge.changed" if change else "knowledge.created",
            obj=obj,
            actor=request.user,
            detail={"key": obj.key, "fields": sorted(form.changed_data)},
        )

    def delete_model(self, request: HttpRequest, obj: KnowledgeItem) -> None:
        audit("knowledge.deleted", obj=obj, actor=request.user, detail={"key": obj.key})
        super().delete_model(request, obj)


@admin.register(SimilarCase)
class SimilarCaseAdmin(ReadOnlyAdmin):
    """Read-only: the links are what a diagnosis found (its event records them)."""

    list_display = ["session", "item", "score", "strategy", "rank", "created_at"]
    list_filter = ["strategy"]


class MetricsSourceForm(forms.ModelForm[MetricsSource]):
    # Write-only: the stored secret is never rendered back; leave empty to keep it.
    secret = forms.CharField(
        label=gettext_lazy("Password or token"),
        required=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "off"}, render_value=False),
        help_text=gettext_lazy(
            "Write only: the basic auth password or the bearer token, stored encrypted and "
            "never shown again. Leave empty to keep the stored one."
        ),
    )
    clear_secret = forms.BooleanField(
        label=gettext_lazy("Remove the stored password or token"), required=False
    )

    class Meta:
        model = MetricsSource
        fields = [
            "name",
            "base_url",
            "auth",
            "username",
            "timeout_seconds",
            "step_seconds",
            "enabled",
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        auth = data.get("auth")
        stored = bool(self.instance.secret_encrypted) and not data.get("clear_secret")
        if auth == MetricsAuth.BEARER and not (data.get("secret") or stored):
            self.add_error("secret", gettext_lazy("A bearer token is needed."))
        return data

    def save(self, commit: bool = True) -> MetricsSource:
        row = super().save(commit=False)
        if self.cleaned_data.get("clear_secret"):
            row.set_secret("")
        if self.cleaned_data.get("secret"):
            row.set_secret(self.cleaned_data["secret"])
        if commit:
            row.save()
        return row


@admin.register(MetricsSource)
class MetricsSourceAdmin(admin.ModelAdmin[MetricsSource]):
    form = MetricsSourceForm
    list_display = ["name", "base_url", "auth", "timeout_seconds", "enabled", "last_test"]
    list_filter = ["enabled", "auth"]
    readonly_fields = ["secret_stored", "last_test"]
    actions = ["test_sources"]

    @admin.display(boolean=True, description=gettext_lazy("Password or token stored"))
    def secret_stored(self, obj: MetricsSource) -> bool:
        return bool(obj.secret_encrypted)

    @admin.display(description=gettext_lazy("Last test"))
    def last_test(self, obj: MetricsSource) -> str:
        if obj.last_tested_at is None:
            return _("never tested")
        word = _("answers") if obj.last_test_ok else _("failed")
        return f"{word}: {obj.last_test_message}"

    @admin.action(description=gettext_lazy("Test connection"), permissions=["change"])
    def test_sources(self, request: HttpRequest, queryset: QuerySet[MetricsSource]) -> None:
        for row in queryset.order_by("name"):
            result = probe_source(row, request.user)
            self.message_user(
                request,
                _("%(name)s: %(answer)s") % {"name": row.name, "answer": result.message},
                messages.SUCCESS if result.ok else messages.ERROR,
            )


@admin.register(SystemSources)
class SystemSourcesAdmin(admin.ModelAdmin[SystemSources]):
    """An admin attaches sources to a system: the metrics source, the code's git server
    and repository; logs are the bundle's. The admin's log audits each change."""

    list_display = ["system", "metrics", "code_server", "repo_path", "updated_at"]
    fields = ["system", "metrics", "code_server", "repo_path"]
