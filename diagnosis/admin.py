from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from diagnosis.models import AgentRun, Event, LLMCall, Report, Restriction, Session, ToolCall


class ReadOnlyAdmin(admin.ModelAdmin[Any]):
    """The agent and the event log write these; admins look, nobody edits history."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


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
    ]
    list_filter = ["status", "scenario"]
    search_fields = ["title", "id"]
    date_hierarchy = "created_at"


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
        "cost",
        "latency_ms",
        "created_at",
    ]
    list_filter = ["provider", "status", "purpose"]


@admin.register(AgentRun)
class AgentRunAdmin(ReadOnlyAdmin):
    list_display = ["agent_name", "session", "parent", "status", "started_at", "ended_at"]
    list_filter = ["agent_name", "status"]


@admin.register(Report)
class ReportAdmin(ReadOnlyAdmin):
    list_display = ["session", "language", "created_at"]


@admin.register(Restriction)
class RestrictionAdmin(ReadOnlyAdmin):
    list_display = ["kind", "target", "session", "created_at", "lifted_at", "lifted_by"]
    list_filter = ["kind"]
