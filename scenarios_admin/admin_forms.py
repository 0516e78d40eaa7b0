"""The scenario row editor's forms (the draft's rows and the scenario form), and the
draft's cross-check: the rows the page describes, checked as one definition."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django import forms
from django.http import QueryDict
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from aero.packs import edited_as_yaml, row_pack
from scenarios_admin.admin_check import CrossCheck, place_problem
from scenarios_admin.definition import Issue
from scenarios_admin.draft import SCENARIO_COLUMNS, Draft, check_draft, row_parts, split_list
from scenarios_admin.models import Scenario, ScenarioKind
from scenarios_admin.schema import field_type_labels, installed_kinds, row_words

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


def _node_kinds() -> list[tuple[str, str]]:
    return [(k, k) for k in row_words("node_kinds")]


def _field_types() -> list[tuple[str, str]]:
    return [("", "---------"), *field_type_labels().items()]


class KindsField(forms.MultipleChoiceField):
    """Node kinds as checkboxes, stored as "stand, taxiway"."""

    widget = forms.CheckboxSelectMultiple

    def __init__(self, **kwargs: Any) -> None:
        kwargs.pop("max_length", None)
        kwargs.pop("empty_value", None)
        super().__init__(choices=_node_kinds, required=False, **kwargs)

    def prepare_value(self, value: Any) -> Any:
        return split_list(value) if isinstance(value, str) else value

    def clean(self, value: Any) -> str:
        return ", ".join(super().clean(value))

    def has_changed(self, initial: Any, data: Any) -> bool:
        before = split_list(initial) if isinstance(initial, str) else list(initial or [])
        return set(before) != set(data or [])


class ScenarioFieldForm(DraftForm):
    type = forms.ChoiceField(choices=_field_types)
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


class ScenarioForm(DraftForm):
    """The scenario's own fields (a pack's settings are its rows': DomainPack.row_inlines)."""

    cross_check: CrossCheck | None = None

    class Meta:
        model = Scenario
        fields = [
            "slug",
            "name_zh",
            "name_en",
            "kind",
            "is_active",
            "system_prompt",
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
        if self.cross_check is not None:
            self.cross_check.form = self


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
SCENARIO_PATHS = {
    "slug": "slug",
    "name.zh": "name_zh",
    "name.en": "name_en",
    "kind": "kind",
    "system_prompt": "system_prompt",
    "report_template.zh": "report_template_zh",
    "report_template.en": "report_template_en",
}


def _column(rest: str, columns: dict[str, str]) -> str | None:
    for prefix in sorted(columns, key=len, reverse=True):
        if rest == prefix or rest.startswith((prefix + ".", prefix + "[")):
            return columns[prefix]
    return None


def validate_scenario(check: CrossCheck) -> list[str]:
    """The draft the page describes, checked as a whole (scenarios_admin.draft.check_draft)."""
    form = check.form
    assert form is not None
    draft = Draft({column: getattr(form.instance, column) for column in SCENARIO_COLUMNS})
    # A part the kind has no rows for reads as empty.
    live: defaultdict[str, list[forms.ModelForm[Any]]] = defaultdict(list)
    for part, (model, columns) in row_parts(form.instance.kind).items():
        formset = check.formset(model)
        live[part] = formset.live_forms() if formset is not None else []
        for row_form in live[part]:
            draft.part(part).append({c: row_form.cleaned_data.get(c) for c in columns})
    _, issues = check_draft(draft)

    fields = {f.cleaned_data["name"]: f for f in live["fields"]}
    values = {(f.cleaned_data["field"], f.cleaned_data["value"]): f for f in live["values"]}
    pack = row_pack(form.instance.kind)
    own = pack.place_draft_issue if pack is not None else None
    summary = []
    for issue in issues:
        summary.append(
            _place_issue(issue, form, fields, values)
            or (own(issue, form, live) if own is not None else None)
            or place_problem(form, None, issue.message, f"Scenario, {issue.path}")
        )
    return summary


def _place_issue(
    issue: Issue,
    form: forms.BaseForm,
    fields: dict[str, forms.ModelForm[Any]],
    values: dict[tuple[str, str], forms.ModelForm[Any]],
) -> str | None:
    path, message = issue.path, issue.message
    if path in SCENARIO_PATHS or any(path.startswith(p + ".") for p in SCENARIO_PATHS):
        key = next(p for p in sorted(SCENARIO_PATHS, key=len, reverse=True) if path.startswith(p))
        return place_problem(form, SCENARIO_PATHS[key], message, "Scenario")
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
    return None
