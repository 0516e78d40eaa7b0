from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from aero.admin_base import ReadOnlyAdmin
from aero.roles import DELETE_SESSIONS, has_role
from diagnosis.actions import ActionError, do_delete_session
from diagnosis.forms import DeleteSessionForm
from diagnosis.models import AgentRun, Event, LLMCall, Report, Session, ToolCall


class DeletedFilter(admin.SimpleListFilter):
    title = "deleted"
    parameter_name = "deleted"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("no", "Not deleted"), ("yes", "Deleted")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "no":
            return queryset.filter(deleted_at__isnull=True)
        if self.value() == "yes":
            return queryset.filter(deleted_at__isnull=False)
        return queryset


@admin.register(Session)
class SessionAdmin(ReadOnlyAdmin):
    list_display = [
        "title",
        "scenario",
        "status",
        "created_by",
        "created_at",
        "tokens_in",
        "tokens_out",
        "cost",
        "deleted_at",
    ]
    list_filter = ["status", "scenario", DeletedFilter]
    search_fields = ["title", "id"]
    date_hierarchy = "created_at"
    actions = ["soft_delete"]

    def has_soft_delete_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, DELETE_SESSIONS)

    @admin.action(
        description="Delete selected sessions (soft: kept for audit and replay)",
        permissions=["soft_delete"],
    )
    def soft_delete(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        """A confirmation page with a required reason first; then each session goes
        through do_delete_session (events, audit, approvals closed)."""
        sessions = list(queryset.filter(deleted_at__isnull=True).order_by("-created_at"))
        form = DeleteSessionForm(request.POST if "confirm_delete" in request.POST else None)
        if "confirm_delete" in request.POST and form.is_valid():
            done, refused = 0, []
            for session in sessions:
                try:
                    do_delete_session(session.pk, request.user, form.cleaned_data["reason"])
                    done += 1
                except ActionError as exc:
                    refused.append(f"{session.title}: {exc}")
            self.message_user(request, f"{done} session(s) deleted; events and audit entries kept.")
            for message in refused:
                self.message_user(request, message, level=messages.ERROR)
            return None
        if not sessions:
            self.message_user(request, "Those sessions were already deleted.", messages.WARNING)
            return None
        return TemplateResponse(
            request,
            "admin/diagnosis/session/soft_delete.html",
            {
                **self.admin_site.each_context(request),
                "title": "Delete sessions?",
                "opts": self.model._meta,
                "sessions": sessions,
                "form": form,
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            },
        )


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["session", "seq", "type", "ts", "producer"]
    list_filter = ["type", "producer"]
    search_fields = ["session__id", "event_id"]
    list_select_related = ["session"]


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ["tool_name", "session", "risk_class", "status", "duration_ms", "created_at"]
    list_filter = ["status", "risk_class", "tool_name"]
    list_select_related = ["session"]


@admin.register(LLMCall)
class LLMCallAdmin(ReadOnlyAdmin):
    list_display = [
        "provider",
        "model",
        "purpose",
        "status",
        "tokens_in",
        "tokens_out",
        "tokens_estimated",
        "cost",
        "latency_ms",
        "error_class",
        "created_at",
    ]
    list_filter = ["provider", "status", "purpose", "tokens_estimated", "error_class"]


@admin.register(AgentRun)
class AgentRunAdmin(ReadOnlyAdmin):
    list_display = ["agent_name", "session", "parent", "status", "started_at", "ended_at"]
    list_filter = ["agent_name", "status"]


@admin.register(Report)
class ReportAdmin(ReadOnlyAdmin):
    list_display = ["session", "language", "created_at"]
