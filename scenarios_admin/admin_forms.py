"""Forms of the scenario admin, and the cross-check that validates a change
form with all its inline rows as one document before anything is saved."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest, QueryDict
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from aero.packs import actions_of, edited_as_yaml, pack_for
from scenarios_admin.actions import run_publish_checks
from scenarios_admin.definition import IMPACT_LISTS, NODE_KINDS, Issue
from scenarios_admin.draft import (
    ROWS,
    SCENARIO_COLUMNS,
    Draft,
    check_draft,
    split_list,
    yaml_draft,
)
from scenarios_admin.models import Scenario, ScenarioKind
from scenarios_admin.schema import definition_issues, installed_kinds
from scenarios_admin.yamlio import dump_definition, load_yaml, locate

COMPLIANCE_LABELS = (
    gettext_lazy("1. start"),
    gettext_lazy("2. all P1 fields known"),
    gettext_lazy("3. risk assessed"),
    gettext_lazy("4. impact analysed"),
    gettext_lazy("5. actions decided"),
    gettext_lazy("6. reported"),
)


# --- the cross-check ----------------------------------------------------------------------


class CrossCheck:
    """Validates a change form and its inline formsets together, once each has validated
    its own rows. The admin passes one CrossCheck per request to the form and to every
    checked formset; the first formset to clean runs it (Django validates the form, then
    the formsets in order, then saves only if all are valid). Errors land on the rows and
    columns they concern, and a summary is kept for the top of the page."""

    def __init__(self, validate: Callable[[CrossCheck], list[str]]) -> None:
        self.validate = validate
        self.form: forms.ModelForm[Any] | None = None
        self.formsets: list[CheckedInlineFormSet] = []
        self.summary: list[str] = []
        self._state = "new"

    @classmethod
    def of(cls, request: HttpRequest, validate: Callable[[CrossCheck], list[str]]) -> CrossCheck:
        check: CrossCheck | None = getattr(request, "_aero_cross_check", None)
        if check is None:
            check = cls(validate)
            request._aero_cross_check = check  # type: ignore[attr-defined]
        return check

    def formset(self, model: type[Any]) -> CheckedInlineFormSet | None:
        return next((fs for fs in self.formsets if fs.model is model), None)

    def run(self) -> None:
        if self._state != "new":
            return
        self._state = "running"
        try:
            # Row-level errors first: the document is only checked when every row is valid.
            rows_valid = all([fs.is_valid() for fs in self.formsets])
            if self.form is None or not self.form.is_valid() or not rows_valid:
                return
            self.summary = self.validate(self)
        finally:
            self._state = "done"
        if self.summary:
            raise ValidationError(
                ngettext(
                    "Nothing was saved: %(n)d problem, listed at the top of the page and "
                    "marked on its row.",
                    "Nothing was saved: %(n)d problems, listed at the top of the page and "
                    "marked on their rows.",
                    len(self.summary),
                )
                % {"n": len(self.summary)}
            )


class CheckedInlineFormSet(BaseInlineFormSet):
    def __init__(self, *args: Any, cross_check: CrossCheck | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cross_check = cross_check
        if cross_check is not None:
            cross_check.formsets.append(self)

    def clean(self) -> None:
        super().clean()
        if self.cross_check is not None:
            self.cross_check.run()

    def live_forms(self) -> list[forms.ModelForm[Any]]:
        """The rows the save would keep, in their display order (position, then as listed)."""
        live = [
            form
            for form in self.forms
            if not (self.can_delete and form.cleaned_data.get("DELETE", False))
            and (form.instance.pk is not None or form.has_changed())
        ]
        if "position" in self.form.base_fields:
            indexed = list(enumerate(live))
            indexed.sort(
                key=lambda pair: (
                    pair[1].cleaned_data.get("position") is None,
                    pair[1].cleaned_data.get("position") or 0,
                    pair[0],
                )
            )
            live = [form for _, form in indexed]
        return live


# --- scenario draft -----------------------------------------------------------------------


def _lf(value: Any) -> Any:
    return value.replace("\r\n", "\n") if isinstance(value, str) else value


# Longest text a draft field takes (a report template is about 3,000 characters): over
# it the save is refused with the field named, never cut.
MAX_DRAFT_TEXT = 20_000


class DraftForm(forms.ModelForm[Any]):
    """Browsers submit textarea line breaks as CRLF; the draft keeps LF, so saving a page
    without changes leaves the draft exactly as it was. Text columns (TextField) have no
    length of their own: MAX_DRAFT_TEXT bounds them."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.is_bound and isinstance(self.data, QueryDict):
            # LF before anything compares: `changed_data` (what admin history says was
            # changed) compares the posted text with the stored one, and CRLF made every
            # multi-line text look changed on a save without changes (issue 12).
            data = self.data.copy()
            for key, values in self.data.lists():
                if any("\r" in v for v in values if isinstance(v, str)):
                    data.setlist(key, [_lf(v) for v in values])
            self.data = data

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean() or {}
        for name, value in list(cleaned.items()):
            if isinstance(value, str):
                value = value.replace("\r\n", "\n")
                cleaned[name] = value
                if len(value) > MAX_DRAFT_TEXT:
                    self.add_error(
                        name,
                        _("Too long (%(n)s characters, at most %(max)s); nothing was saved.")
                        % {"n": f"{len(value):,}", "max": f"{MAX_DRAFT_TEXT:,}"},
                    )
        return cleaned


class KindsField(forms.MultipleChoiceField):
    """Node kinds as checkboxes, stored as "stand, taxiway"."""

    widget = forms.CheckboxSelectMultiple

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("max_length", None)
        kwargs.pop("empty_value", None)
        super().__init__(choices=[(k, k) for k in NODE_KINDS], required=False, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        return split_list(value) if isinstance(value, str) else value

    def clean(self, value: Any) -> str:
        return ", ".join(super().clean(value))

    def has_changed(self, initial: Any, data: Any) -> bool:
        before = split_list(initial) if isinstance(initial, str) else list(initial or [])
        return set(before) != set(data or [])


class ScenarioFieldForm(DraftForm):
    kinds = KindsField(
        help_text=gettext_lazy("Position fields: node kinds accepted (none ticked: all).")
    )

    class Meta:
        widgets = {
            "ask_zh": forms.Textarea(attrs={"rows": 2, "cols": 50}),
            "ask_en": forms.Textarea(attrs={"rows": 2, "cols": 50}),
        }


class FieldValueForm(DraftForm):
    class Meta:
        widgets = {
            "synonyms": forms.Textarea(attrs={"rows": 2, "cols": 40}),
            "fallback": forms.Textarea(attrs={"rows": 1, "cols": 20}),
            "field": forms.TextInput(attrs={"size": 16}),
            "value": forms.TextInput(attrs={"size": 14}),
        }


class RiskRuleForm(DraftForm):
    class Meta:
        widgets = {"condition": forms.TextInput(attrs={"size": 70})}


def _action_choices() -> list[tuple[str, str]]:
    """The row-edited draft's kind's actions (read when a form is made: packs register
    theirs when the apps are ready)."""
    return [("", "---------"), *[(t, t) for t in sorted(actions_of(ScenarioKind.APRON))]]


class ScenarioActionForm(DraftForm):
    tool = forms.ChoiceField(choices=_action_choices)
    for_each = forms.ChoiceField(
        choices=[
            ("", gettext_lazy("(once)")),
            *[(f"impact.{n}", f"each of impact.{n}") for n in IMPACT_LISTS],
        ],
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


def _state_field(number: int) -> forms.CharField:
    return forms.CharField(
        label=COMPLIANCE_LABELS[number - 1],
        max_length=40,
        widget=forms.TextInput(attrs={"size": 18}),
    )


class ScenarioForm(DraftForm):
    """The scenario's own fields, with the six compliance states as six inputs."""

    cross_check: CrossCheck | None = None
    state_1 = _state_field(1)
    state_2 = _state_field(2)
    state_3 = _state_field(3)
    state_4 = _state_field(4)
    state_5 = _state_field(5)
    state_6 = _state_field(6)

    class Meta:
        model = Scenario
        fields = [
            "slug",
            "name_zh",
            "name_en",
            "kind",
            "is_active",
            "system_prompt",
            "impact_start",
            "radius_key",
            "default_radius",
            "report_template_zh",
            "report_template_en",
            "budget_steps",
            "budget_tokens",
            "budget_cost",
        ]
        widgets = {
            "system_prompt": forms.Textarea(attrs={"rows": 5, "cols": 100}),
            "report_template_zh": forms.Textarea(attrs={"rows": 16, "cols": 100}),
            "report_template_en": forms.Textarea(attrs={"rows": 16, "cols": 100}),
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name in ("system_prompt", "report_template_zh", "report_template_en"):
            field = self.fields.get(name)
            if isinstance(field, forms.CharField):
                field.strip = False  # a template's final newline is part of it
        kind = self.fields.get("kind")
        if isinstance(kind, forms.ChoiceField):
            # A kind no installed domain pack serves is not offered, and refused if
            # posted, unless the scenario already is one (shown as it is).
            served = installed_kinds()
            if self.instance._state.adding:
                # a kind written as YAML is added from its own page (the admin links it)
                served = [k for k in served if not edited_as_yaml(k)]
            kind.choices = [
                (value, label)
                for value, label in [("", "---------"), *ScenarioKind.choices]
                if value in ("", *served) or value == self.instance.kind
            ]
        states = list(self.instance.compliance_states or [])
        for i in range(len(COMPLIANCE_LABELS)):
            if i < len(states):
                self.fields[f"state_{i + 1}"].initial = states[i]
        if self.cross_check is not None:
            self.cross_check.form = self

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean() or {}
        self.instance.compliance_states = [
            str(cleaned.get(f"state_{i + 1}", "")).strip() for i in range(len(COMPLIANCE_LABELS))
        ]
        return cleaned


# Where a path of the definition is edited: (draft part, column) per leading key.
FIELD_COLUMNS = {
    "label.zh": "label_zh",
    "label.en": "label_en",
    "label": "label_zh",
    "ask.zh": "ask_zh",
    "ask.en": "ask_en",
    "type": "type",
    "priority": "priority",
    "kinds": "kinds",
    "default": "default",
    "measure.units": "measure_units",
    "measure.bands": "measure_bands",
    "measure": "measure_bands",
}
VALUE_COLUMNS = {"label": "label_zh", "synonyms": "synonyms", "fallback": "fallback"}
RULE_COLUMNS = {"id": "rule_id", "when": "condition", "level": "level", "score": "score"}
ACTION_COLUMNS = {
    "tool": "tool",
    "risk_class": "risk_class",
    "when": "condition",
    "for_each": "for_each",
    "args": "args",
}
EXAMPLE_COLUMNS = {
    "text": "text",
    "fields": "expected_fields",
    "rule": "rule",
    "level": "level",
    "actions": "actions",
}
SCENARIO_PATHS = {
    "slug": "slug",
    "name.zh": "name_zh",
    "name.en": "name_en",
    "kind": "kind",
    "system_prompt": "system_prompt",
    "impact.start": "impact_start",
    "impact.radius_key": "radius_key",
    "impact.default_radius": "default_radius",
    "compliance.states": "state_1",
    "report_template.zh": "report_template_zh",
    "report_template.en": "report_template_en",
}
_INDEXED = re.compile(r"^(risk_rules|actions|examples)\[(\d+)\](?:\.(.*))?$")


def _column(rest: str, columns: dict[str, str]) -> str | None:
    for prefix in sorted(columns, key=len, reverse=True):
        if rest == prefix or rest.startswith((prefix + ".", prefix + "[")):
            return columns[prefix]
    return None


def place_problem(
    form: forms.BaseForm, column: str | None, message: str, label: str, verbose: str = ""
) -> str:
    if column is not None and column in form.fields:
        form.add_error(column, message)
        verbose = verbose or str(form.fields[column].label or column)
        return f"{label}, {verbose.lower()}: {message}"
    form.add_error(None, message)
    return f"{label}: {message}"


def validate_scenario(check: CrossCheck) -> list[str]:
    """The draft the page describes, checked as a whole (scenarios_admin.draft.check_draft)."""
    form = check.form
    assert form is not None
    draft = Draft({column: getattr(form.instance, column) for column in SCENARIO_COLUMNS})
    live: dict[str, list[forms.ModelForm[Any]]] = {}
    for part, (model, columns) in ROWS.items():
        formset = check.formset(model)
        live[part] = formset.live_forms() if formset is not None else []
        for row_form in live[part]:
            draft.part(part).append({c: row_form.cleaned_data.get(c) for c in columns})
    _, issues = check_draft(draft)

    fields = {f.cleaned_data["name"]: f for f in live["fields"]}
    values = {(f.cleaned_data["field"], f.cleaned_data["value"]): f for f in live["values"]}
    radii = {(f.cleaned_data["key_value"], f.cleaned_data["level"]): f for f in live["radii"]}
    indexed = {
        "risk_rules": live["rules"],
        "actions": live["actions"],
        "examples": live["examples"],
    }
    summary = []
    for issue in issues:
        summary.append(
            _place_issue(issue, form, fields, values, radii, indexed)
            or place_problem(form, None, issue.message, f"Scenario, {issue.path}")
        )
    return summary


def _place_issue(
    issue: Issue,
    form: forms.BaseForm,
    fields: dict[str, forms.ModelForm[Any]],
    values: dict[tuple[str, str], forms.ModelForm[Any]],
    radii: dict[tuple[str, str], forms.ModelForm[Any]],
    indexed: dict[str, list[forms.ModelForm[Any]]],
) -> str | None:
    path, message = issue.path, issue.message
    if path in SCENARIO_PATHS or any(path.startswith(p + ".") for p in SCENARIO_PATHS):
        key = next(p for p in sorted(SCENARIO_PATHS, key=len, reverse=True) if path.startswith(p))
        verbose = "compliance states" if key == "compliance.states" else ""
        return place_problem(form, SCENARIO_PATHS[key], message, "Scenario", verbose)
    match = _INDEXED.match(path)
    if match:
        part, index, rest = match.group(1), int(match.group(2)), match.group(3) or ""
        rows = indexed[part]
        if index < len(rows):
            row = rows[index]
            if part == "risk_rules":
                label = f"Risk rule {row.cleaned_data['rule_id']} (row {index + 1})"
                return place_problem(row, _column(rest, RULE_COLUMNS), message, label)
            if part == "actions":
                label = f"Action {row.cleaned_data['tool']} (row {index + 1})"
                return place_problem(row, _column(rest, ACTION_COLUMNS), message, label)
            label = f"Example {index + 1}"
            return place_problem(row, _column(rest, EXAMPLE_COLUMNS), message, label)
        return None
    if path.startswith("fields."):
        name, _, rest = path[len("fields.") :].partition(".")
        if rest.startswith("values."):
            value, _, value_rest = rest[len("values.") :].partition(".")
            value_row = values.get((name, value))
            if value_row is not None:
                label = f"Value {value} of field {name}"
                return place_problem(value_row, _column(value_rest, VALUE_COLUMNS), message, label)
        field_row = fields.get(name)
        if field_row is not None:
            return place_problem(field_row, _column(rest, FIELD_COLUMNS), message, f"Field {name}")
        return None
    if path.startswith("impact.radius"):
        suffix = path[len("impact.radius.") :] if path.startswith("impact.radius.") else ""
        for (value, level), row in radii.items():
            row_path = f"{value}.{level}" if value else level
            if suffix and (row_path == suffix or row_path.startswith(suffix + ".")):
                column = "hops" if row_path == suffix else "key_value"
                return place_problem(row, column, message, "Spread radius")
        return place_problem(form, "radius_key", message, "Spread radius")
    return None


# --- a scenario edited as one YAML document ----------------------------------------------


class DefinitionYamlForm(forms.ModelForm[Any]):
    """A scenario whose pack has no row editor (aero.packs edited_as_yaml): its whole
    definition as YAML, checked by the pack's model. A problem is shown with its line and
    path (`line 12: playbook.window_minutes: ...`), and nothing is saved until none is left."""

    definition_yaml = forms.CharField(
        label=gettext_lazy("Definition (YAML)"),
        widget=forms.Textarea(attrs={"rows": 40, "cols": 100, "spellcheck": "false"}),
        help_text=gettext_lazy(
            "The whole definition, as exported. Saving keeps a draft; sessions run a "
            "published version."
        ),
    )

    class Meta:
        model = Scenario
        fields = ["is_active"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.is_bound:
            self.initial["definition_yaml"] = self.starting_text()
        self.definition: dict[str, Any] | None = None

    def starting_text(self) -> str:
        draft = yaml_draft(self.instance)
        return dump_definition(draft) if draft else ""

    def clean_definition_yaml(self) -> str:
        text: str = self.cleaned_data["definition_yaml"].replace("\r\n", "\n")
        data, unreadable = load_yaml(text)
        if unreadable:
            raise ValidationError([str(issue) for issue in unreadable])
        if not isinstance(data, dict):
            raise ValidationError(_("The definition must be a mapping (key: value lines)."))
        fixed = self.identity_problems(data)
        if fixed:
            raise ValidationError(fixed)
        issues = definition_issues(data)
        if issues:
            raise ValidationError([str(issue) for issue in locate(issues, text)])
        self.definition = data
        return text

    def identity_problems(self, data: dict[str, Any]) -> list[str]:
        """The slug and kind name this scenario in every version and session: they stay."""
        scenario = self.instance
        return [
            _("%(key)s: is %(given)s; this scenario's is %(own)s (it cannot change here)")
            % {"key": key, "given": data.get(key), "own": getattr(scenario, key)}
            for key in ("slug", "kind")
            if data.get(key) != getattr(scenario, key)
        ]

    def save(self, commit: bool = True) -> Scenario:
        scenario: Scenario = super().save(commit=False)
        if self.definition is not None:
            scenario.definition_draft = self.definition
            scenario.name_zh = self.definition["name"]["zh"]
            scenario.name_en = self.definition["name"]["en"]
        if commit:
            scenario.save()
        return scenario


class DefinitionYamlAddForm(DefinitionYamlForm):
    """A new scenario of a kind written as YAML (the admin's add page, `?kind=`): the
    editor starts from the kind's shipped definition (aero.packs starting_definition)
    under a free slug and a new name. Saved only once the pack's model and its example
    cases pass; the admin then publishes it as version 1."""

    kind = ""  # set by the admin for the kind chosen

    def starting_text(self) -> str:
        return dump_definition(starting_definition(self.kind))

    def identity_problems(self, data: dict[str, Any]) -> list[str]:
        problems = []
        if data.get("kind") != self.kind:
            problems.append(
                _("kind: is %(given)s; this page adds a scenario of kind %(kind)s")
                % {"given": data.get("kind"), "kind": self.kind}
            )
        slug = data.get("slug")
        if isinstance(slug, str) and Scenario.objects.filter(slug=slug).exists():
            problems.append(
                _("slug: %(slug)s is taken by another scenario; choose another") % {"slug": slug}
            )
        return problems

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        if self.definition is not None:
            # Version 1 is published with the page's save: its self-check runs first, so
            # a definition whose example cases fail saves nothing.
            failures = run_publish_checks(self.definition)
            if failures:
                self.add_error(
                    "definition_yaml",
                    [_("The example cases fail, so nothing was saved:"), *failures],
                )
                self.definition = None
        return cleaned

    def save(self, commit: bool = True) -> Scenario:
        scenario = super().save(commit=False)
        if self.definition is not None:
            scenario.slug = self.definition["slug"]
            scenario.kind = self.kind
        if commit:
            scenario.save()
        return scenario


def starting_definition(kind: str) -> dict[str, Any]:
    """The kind's shipped definition under the first free slug (`<slug>_2`, ...) and a
    name that says it is new."""
    pack = pack_for(kind)
    assert pack.starting_definition is not None
    definition = copy.deepcopy(pack.starting_definition())
    base = str(definition["slug"])
    taken = set(Scenario.objects.filter(slug__startswith=base).values_list("slug", flat=True))
    number = 2
    while f"{base}_{number}" in taken:
        number += 1
    definition["slug"] = f"{base}_{number}"
    names = definition.get("name") or {}
    definition["name"] = {
        "zh": f"{names.get('zh', base)}（新 {number}）",
        "en": f"{names.get('en', base)} (new {number})",
    }
    return definition
