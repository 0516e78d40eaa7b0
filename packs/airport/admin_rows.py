"""The apron's row editor in the scenario admin: the forms and inlines of its own draft
rows (rules, spread radius, actions, examples), and the page's inlines in their order (most
edited first), given to the core through DomainPack.row_inlines."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.utils.translation import gettext_lazy

from aero.packs import actions_of
from packs.airport.models import RiskRule, ScenarioAction, ScenarioExample, SpreadRadius
from scenarios_admin.admin_check import CheckedInlineFormSet
from scenarios_admin.admin_forms import DraftForm
from scenarios_admin.admin_inlines import FieldInline, ValueInline
from scenarios_admin.models import Scenario, ScenarioKind
from scenarios_admin.schema import row_words


class RiskRuleForm(DraftForm):
    class Meta:
        widgets = {"condition": forms.TextInput(attrs={"size": 70})}


def _action_choices() -> list[tuple[str, str]]:
    """The row-edited draft's kind's actions (read when a form is made: packs register
    theirs when the apps are ready)."""
    return [("", "---------"), *[(t, t) for t in sorted(actions_of(ScenarioKind.APRON))]]


def _for_each_choices() -> list[tuple[str, Any]]:
    lists = row_words("impact_lists")
    return [("", gettext_lazy("(once)")), *[(f"impact.{n}", f"each of impact.{n}") for n in lists]]


class ScenarioActionForm(DraftForm):
    tool = forms.ChoiceField(choices=_action_choices)
    for_each = forms.ChoiceField(
        choices=_for_each_choices,
        required=False,
        help_text=gettext_lazy("One action per item of an impact list ({item} in the arguments)."),
    )

    class Meta:
        widgets = {
            "condition": forms.TextInput(attrs={"size": 40}),
            "args": forms.Textarea(attrs={"rows": 2, "cols": 50}),
        }


class ScenarioExampleForm(DraftForm):
    class Meta:
        widgets = {
            "text": forms.Textarea(attrs={"rows": 2, "cols": 40}),
            "expected_fields": forms.Textarea(attrs={"rows": 2, "cols": 40}),
            "actions": forms.Textarea(attrs={"rows": 2, "cols": 30}),
            "rule": forms.TextInput(attrs={"size": 8}),
        }


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


# Most edited first (synonyms, rules, actions), the rest folded: with everything open the
# page is very long. A section with errors opens by itself.
ROW_INLINES = (ValueInline, RuleInline, ActionInline, FieldInline, RadiusInline, ExampleInline)
