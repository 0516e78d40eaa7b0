from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from aero.admin_base import ReadOnlyAdmin
from aero.models import audit
from packs.diagnosis.models import KnowledgeItem, SimilarCase


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
