from __future__ import annotations

from django.contrib import admin

from aero.admin_base import ReadOnlyAdmin
from approvals.models import Approval


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
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
