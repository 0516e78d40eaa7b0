from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from approvals.models import Approval


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin[Approval]):
    """Decisions are made on the session page or the CLI, where the policy applies."""

    list_display = [
        "action_name",
        "risk_class",
        "status",
        "session",
        "created_at",
        "approver",
        "decided_at",
    ]
    list_filter = ["status", "risk_class"]
    readonly_fields = [f.name for f in Approval._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
