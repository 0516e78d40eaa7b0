"""The inlines of the scenario draft's rows every row-edited kind has (its fields and their
values): a pack's row editor lists them among its own (DomainPack.row_inlines)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import F, OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.translation import gettext_lazy

from scenarios_admin.admin_check import CheckedInlineFormSet
from scenarios_admin.admin_forms import FieldValueForm, ScenarioFieldForm
from scenarios_admin.models import FieldValue, Scenario, ScenarioField


class FieldInline(admin.StackedInline[ScenarioField, Scenario]):
    model = ScenarioField
    classes = ["collapse"]
    form = ScenarioFieldForm
    formset = CheckedInlineFormSet
    extra = 0
    verbose_name_plural = gettext_lazy(
        "Fields (the checklist: P1 fields are asked for before risk assessment)"
    )
    fieldsets = [
        (
            None,
            {
                "fields": [
                    ("position", "name", "type", "priority"),
                    ("label_zh", "label_en"),
                    ("ask_zh", "ask_en"),
                    "kinds",
                    ("default", "measure_units", "measure_bands"),
                ]
            },
        )
    ]


class ValueInline(admin.TabularInline[FieldValue, Scenario]):
    model = FieldValue
    form = FieldValueForm
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["position", "field", "value", "label_zh", "label_en", "synonyms", "fallback"]
    verbose_name_plural = gettext_lazy(
        "Values of enum and bool fields, with the synonyms the extractor reads"
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[FieldValue]:
        field_position = ScenarioField.objects.filter(
            scenario=OuterRef("scenario"), name=OuterRef("field")
        ).values("position")[:1]
        return (
            super()
            .get_queryset(request)
            .annotate(field_position=Subquery(field_position))
            .order_by(F("field_position").asc(nulls_last=True), "field", "position", "id")
        )
