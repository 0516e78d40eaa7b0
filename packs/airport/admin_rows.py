"""The apron's row editor in the scenario admin: the forms and inlines of its own draft
rows (its settings, rules, spread radius, actions, examples), and the page's inlines in
their order (most edited first), given to the core through DomainPack.row_inlines."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.utils.translation import gettext_lazy

from aero.packs import actions_of
from packs.airport.models import (
    ApronDraft,
    RiskRule,
    ScenarioAction,
    ScenarioExample,
    SpreadRadius,
)
from scenarios_admin.admin_check import CheckedInlineFormSet
from scenarios_admin.admin_forms import DraftForm
from scenarios_admin.admin_inlines import FieldInline, ValueInline
from scenarios_admin.models import Scenario, ScenarioKind
from scenarios_admin.schema import row_words

# The compliance state machine's six positional states (packs.airport.agent.fsm).
COMPLIANCE_LABELS = (
    gettext_lazy("1. start"),
    gettext_lazy("2. all P1 fields known"),
    gettext_lazy("3. risk assessed"),
    gettext_lazy("4. impact analysed"),
    gettext_lazy("5. actions decided"),
    gettext_lazy("6. reported"),
)
STATE_FIELDS = tuple(f"state_{i + 1}" for i in range(len(COMPLIANCE_LABELS)))


def _state_field(number: int) -> forms.CharField:
    return forms.CharField(
        label=COMPLIANCE_LABELS[number - 1],
        max_length=40,
        widget=forms.TextInput(attrs={"size": 18}),
    )


class ApronDraftForm(DraftForm):
    """The apron settings, with the six compliance states as six inputs."""

    state_1 = _state_field(1)
    state_2 = _state_field(2)
    state_3 = _state_field(3)
    state_4 = _state_field(4)
    state_5 = _state_field(5)
    state_6 = _state_field(6)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        states = list(self.instance.compliance_states or [])
        for name, state in zip(STATE_FIELDS, states, strict=False):
            self.fields[name].initial = state

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean() or {}
        states = [str(cleaned.get(name, "")).strip() for name in STATE_FIELDS]
        # The draft's cross-check reads the row's columns from cleaned_data.
        cleaned["compliance_states"] = self.instance.compliance_states = states
        return cleaned


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


class SettingsInline(admin.StackedInline[ApronDraft, Scenario]):
    model = ApronDraft
    form = ApronDraftForm
    formset = CheckedInlineFormSet
    min_num = 1
    max_num = 1
    extra = 0
    can_delete = False
    verbose_name = gettext_lazy("Apron settings")
    verbose_name_plural = gettext_lazy("Impact analysis and compliance state machine")
    fieldsets = [
        (
            gettext_lazy("Impact analysis"),
            {"fields": [("impact_start", "radius_key", "default_radius")]},
        ),
        (
            gettext_lazy("Compliance state machine"),
            {
                "classes": ["collapse"],
                "description": gettext_lazy(
                    "The six states a session passes through, in order. The agent may only "
                    "assess risk once all P1 fields are known, propose actions after the "
                    "impact analysis, and report once every action is decided."
                ),
                "fields": [STATE_FIELDS[:3], STATE_FIELDS[3:]],
            },
        ),
    ]


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
# The settings sit where the scenario form's impact and compliance sections were, above
# the rows.
ROW_INLINES = (
    SettingsInline,
    ValueInline,
    RuleInline,
    ActionInline,
    FieldInline,
    RadiusInline,
    ExampleInline,
)
