from __future__ import annotations

import re
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse

from aero.admin_base import ReadOnlyAdmin
from ingest.config import provider
from ingest.models import GateRule, GateSettings, Observation


class GateReloadStatus:
    """Admins see whether the gate runs on what they saved: a reload that failed
    validation keeps the old snapshot, and says so on every gate admin page."""

    def _report(self, request: HttpRequest) -> None:
        try:
            snapshot = provider.current()
        except Exception as exc:  # no valid configuration at all
            messages.error(request, f"The gate has no valid configuration: {exc}")
            return
        if provider.last_error:
            messages.error(
                request,
                f"The last gate reload failed ({provider.last_error_at:%Y-%m-%d %H:%M:%S}): "
                f"{provider.last_error}. The gate still runs on {snapshot.version}.",
            )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        self._report(request)
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    def response_change(self, request: HttpRequest, obj: Any) -> HttpResponse:
        self._report(request)
        return super().response_change(request, obj)  # type: ignore[misc]

    def response_add(
        self, request: HttpRequest, obj: Any, post_url_continue: Any = None
    ) -> HttpResponse:
        self._report(request)
        return super().response_add(request, obj, post_url_continue)  # type: ignore[misc]


class GateRuleForm(forms.ModelForm[GateRule]):
    class Meta:
        model = GateRule
        fields = [
            "name",
            "position",
            "enabled",
            "matchers",
            "scenario",
            "base_score",
            "action",
            "group_by",
        ]

    def clean_matchers(self) -> dict[str, str]:
        matchers = self.cleaned_data["matchers"]
        if not isinstance(matchers, dict):
            raise forms.ValidationError(
                'Give an object of label -> regex, e.g. {"alertname": "Fuel.*"}.'
            )
        for label, pattern in matchers.items():
            try:
                re.compile(str(pattern))
            except re.error as exc:
                raise forms.ValidationError(f"Bad regular expression for {label}: {exc}") from exc
        return matchers

    def clean_group_by(self) -> list[str]:
        group_by = self.cleaned_data["group_by"] or []
        if not isinstance(group_by, list) or not all(isinstance(g, str) for g in group_by):
            raise forms.ValidationError(
                'Give a list of label names, e.g. ["alertname", "instance"].'
            )
        return group_by

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("action") == GateRule.Action.DELIVER and not data.get("scenario"):
            raise forms.ValidationError(
                "An always-deliver rule needs a scenario to open sessions in."
            )
        return data


@admin.register(GateRule)
class GateRuleAdmin(GateReloadStatus, admin.ModelAdmin[GateRule]):
    form = GateRuleForm
    list_display = ["name", "position", "enabled", "scenario", "base_score", "action"]
    list_editable = ["position", "enabled"]
    ordering = ["position", "id"]


class GateSettingsForm(forms.ModelForm[GateSettings]):
    class Meta:
        model = GateSettings
        fields = [
            "deliver_threshold",
            "sink_threshold",
            "dedup_window_seconds",
            "severity_scores",
            "unmatched",
        ]

    def clean_severity_scores(self) -> dict[str, int]:
        scores = self.cleaned_data["severity_scores"] or {}
        if not isinstance(scores, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in scores.values()
        ):
            raise forms.ValidationError(
                'Give an object of severity -> points, e.g. {"critical": 60}.'
            )
        return scores

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if (data.get("sink_threshold") or 0) > (data.get("deliver_threshold") or 0):
            raise forms.ValidationError(
                "The sink threshold must not be above the deliver threshold."
            )
        return data


@admin.register(GateSettings)
class GateSettingsAdmin(GateReloadStatus, admin.ModelAdmin[GateSettings]):
    form = GateSettingsForm
    list_display = [
        "__str__",
        "deliver_threshold",
        "sink_threshold",
        "dedup_window_seconds",
        "unmatched",
        "updated_at",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not GateSettings.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Observation)
class ObservationAdmin(ReadOnlyAdmin):
    list_display = [
        "received_at",
        "source",
        "name",
        "status",
        "decision",
        "stage",
        "score",
        "reason",
        "session",
    ]
    list_filter = ["decision", "stage", "source", "status"]
    search_fields = ["name", "fingerprint", "group_key"]
    readonly_fields = [f.name for f in Observation._meta.fields]
