from __future__ import annotations

from django.contrib import admin

from aero.admin_base import ReadOnlyAdmin
from aero.models import AuditLog


@admin.register(AuditLog)
class AuditLogAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "actor_label", "action", "object_type", "object_id", "session_id"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor_label", "action", "object_id"]
    readonly_fields = [f.name for f in AuditLog._meta.fields]
