"""The scenario draft's rows as the row editor's inlines (most edited first)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import F, OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.translation import gettext_lazy

from scenarios_admin.admin_check import CheckedInlineFormSet
from scenarios_admin.admin_forms import (
    FieldValueForm,
    RiskRuleForm,
    ScenarioActionForm,
    ScenarioExampleForm,
    ScenarioFieldForm,
)
from scenarios_admin.models import (
    FieldValue,
    RiskRule,
    Scenario,
    ScenarioAction,
    ScenarioExample,
    ScenarioField,
    SpreadRadius,
)


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


class RuleInline(admin.TabularInline[RiskRule, Scenario]):
    model = RiskRule
    form = RiskRuleForm
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["position", "rule_id", "condition", "level", "score"]
    verbose_name_plural = gettext_lazy(
        "Risk rules (first match wins; the last one has an empty condition)"
    )


class RadiusInline(admin.TabularInline[SpreadRadius, Scenario]):
    model = SpreadRadius
    classes = ["collapse"]
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["key_value", "level", "hops"]
    verbose_name_plural = gettext_lazy(
        "Spread radius (hops of the impact analysis, by value and level)"
    )


class ActionInline(admin.TabularInline[ScenarioAction, Scenario]):
    model = ScenarioAction
    form = ScenarioActionForm
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["position", "tool", "risk_class", "condition", "for_each", "args"]
    verbose_name_plural = gettext_lazy(
        "Required actions (proposed in this order when their condition holds)"
    )


class ExampleInline(admin.TabularInline[ScenarioExample, Scenario]):
    model = ScenarioExample
    classes = ["collapse"]
    form = ScenarioExampleForm
    formset = CheckedInlineFormSet
    extra = 0
    fields = ["position", "text", "expected_fields", "rule", "level", "actions"]
    verbose_name_plural = gettext_lazy(
        "Example cases (the self-check: all must pass before publishing)"
    )
