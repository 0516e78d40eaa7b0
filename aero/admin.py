from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from aero.models import AuditLog


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin[AuditLog]):
    list_display = ["created_at", "actor_label", "action", "object_type", "object_id", "session_id"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor_label", "action", "object_id"]
    readonly_fields = [f.name for f in AuditLog._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
