"""A scenario's draft (the rows admins edit) and the definition (the JSON document the
agent runs) are two forms of the same thing:

    definition_from_draft(draft_from_definition(d)) == normalize(d) == d   for a valid,
                                                                          normal d

A Draft holds plain row dicts, so the admin (from its forms), the YAML import (from a
file) and the database (`draft_of` / `save_draft`) all go through the same two functions
and the same validation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction
from django.db.models import F, Field

from aero.packs import draft_rows, edited_as_yaml, row_pack
from scenarios_admin.conditions import ConditionSyntaxError, parse_condition
from scenarios_admin.definition import LIST_SEPARATORS, Issue
from scenarios_admin.models import FieldValue, Scenario, ScenarioField
from scenarios_admin.schema import definition_issues

SCENARIO_COLUMNS = (
    "slug",
    "name_zh",
    "name_en",
    "kind",
    "system_prompt",
    "report_template_zh",
    "report_template_en",
    "budget_steps",
    "budget_tokens",
    "budget_cost",
)
FIELD_COLUMNS = (
    "name",
    "label_zh",
    "label_en",
    "type",
    "priority",
    "ask_zh",
    "ask_en",
    "kinds",
    "default",
    "measure_units",
    "measure_bands",
)
VALUE_COLUMNS = ("field", "value", "label_zh", "label_en", "synonyms", "fallback")

# Draft part -> (model, columns): the parts every row-edited kind has. A pack adds its own
# (DomainPack.draft_rows: the apron's rules, spread radius, actions and examples).
CORE_ROWS: dict[str, tuple[type[Any], tuple[str, ...]]] = {
    "fields": (ScenarioField, FIELD_COLUMNS),
    "values": (FieldValue, VALUE_COLUMNS),
}


def row_parts(kind: str) -> dict[str, tuple[type[Any], tuple[str, ...]]]:
    """The draft parts of a scenario of `kind`, in the order rows are written in."""
    return {**CORE_ROWS, **draft_rows(kind)}


_BAND = re.compile(r"^([A-Za-z0-9_]+)\s*(?:(>=|>)\s*(-?\d+(?:\.\d+)?))?$")
_ARG = re.compile(r"^\s*([a-z_][a-z0-9_]*)\s*=(.*)$")


@dataclass
class Draft:
    """The scenario's columns, the core's rows (fields and their values) and the rows of
    the parts its pack adds (DomainPack.draft_rows), by part name."""

    scenario: dict[str, Any]
    fields: list[dict[str, Any]] = field(default_factory=list)
    values: list[dict[str, Any]] = field(default_factory=list)
    parts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def part(self, name: str) -> list[dict[str, Any]]:
        if name in ("fields", "values"):
            rows: list[dict[str, Any]] = getattr(self, name)
            return rows
        return self.parts.setdefault(name, [])


# --- database -------------------------------------------------------------------------


def draft_of(scenario: Scenario) -> Draft:
    draft = Draft({column: getattr(scenario, column) for column in SCENARIO_COLUMNS})
    for part, (model, columns) in row_parts(scenario.kind).items():
        rows = model.objects.filter(scenario=scenario)
        if _has_position(model):
            rows = rows.order_by(F("position").asc(nulls_last=True), "id")
        else:
            rows = rows.order_by("id")
        draft.part(part).extend(rows.values(*columns))
    return draft


@transaction.atomic
def save_draft(scenario: Scenario, draft: Draft) -> None:
    """Replace the scenario's draft (the slug never changes)."""
    for column in SCENARIO_COLUMNS:
        if column != "slug":
            # A column no part of the kind reads keeps the model's default.
            model_field = Scenario._meta.get_field(column)
            default = model_field.get_default() if isinstance(model_field, Field) else None
            setattr(scenario, column, draft.scenario.get(column, default))
    scenario.save()
    for part, (model, columns) in row_parts(scenario.kind).items():
        model.objects.filter(scenario=scenario).delete()
        has_position = _has_position(model)
        model.objects.bulk_create(
            model(
                scenario=scenario,
                **({"position": (i + 1) * 10} if has_position else {}),
                **{c: row[c] for c in columns},
            )
            for i, row in enumerate(draft.part(part))
        )


def _has_position(model: type[Any]) -> bool:
    return any(f.name == "position" for f in model._meta.fields)


def renumber(scenario: Scenario) -> None:
    """Positions 10, 20, 30, ... in the current order (rows without one go last), so an
    admin can slot a row in between with 15."""
    for model, _ in row_parts(scenario.kind).values():
        if not _has_position(model):
            continue
        rows = list(model.objects.filter(scenario=scenario))
        rows.sort(key=lambda r: (r.position is None, r.position or 0, r.pk))
        for i, row in enumerate(rows):
            row.position = (i + 1) * 10
        model.objects.bulk_update(rows, ["position"])


def assemble(scenario: Scenario) -> tuple[dict[str, Any], list[Issue]]:
    """The scenario's draft as a definition, with every problem (assembly and schema)."""
    if edited_as_yaml(scenario.kind):
        definition = yaml_draft(scenario)
        return definition, definition_issues(definition)
    return check_draft(draft_of(scenario))


def yaml_draft(scenario: Scenario) -> dict[str, Any]:
    """The draft of a scenario edited as one document: the saved one, else the newest
    version's (a scenario its pack published has no saved draft until an admin saves)."""
    if scenario.definition_draft is not None:
        return dict(scenario.definition_draft)
    latest = scenario.latest_version()
    return dict(latest.definition) if latest is not None else {}


def save_yaml_draft(scenario: Scenario, definition: dict[str, Any]) -> None:
    """Replace the draft of a scenario edited as one document (the slug never changes;
    the names follow the document's)."""
    scenario.definition_draft = definition
    scenario.name_zh = definition["name"]["zh"]
    scenario.name_en = definition["name"]["en"]
    scenario.save()


def check_draft(draft: Draft) -> tuple[dict[str, Any], list[Issue]]:
    definition, issues = definition_from_draft(draft)
    # A part that could not be read (a condition with a syntax error) stands in as a
    # placeholder; what the schema says about that placeholder would only confuse.
    broken = [issue.path for issue in issues]
    for issue in definition_issues(definition):
        if not any(issue.path == p or issue.path.startswith((p + ".", p + "[")) for p in broken):
            issues.append(issue)
    return definition, issues


def normalize(definition: dict[str, Any]) -> dict[str, Any]:
    """The definition as the draft rows would produce it (for a valid definition: the
    same content, with optional empty parts dropped and `system_prompt`/`examples` set)."""
    normal, _ = definition_from_draft(draft_from_definition(definition))
    return normal


# --- rows -> definition -----------------------------------------------------------------


def split_list(text: str) -> list[str]:
    return [word.strip() for word in LIST_SEPARATORS.split(text or "") if word.strip()]


def read_condition(text: str, path: str, issues: list[Issue]) -> dict[str, Any]:
    try:
        return parse_condition(text or "")
    except ConditionSyntaxError as exc:
        issues.append(Issue(path, f"cannot read {text!r}: {exc}"))
        return {"?": text}


def _bands(text: str, path: str, issues: list[Issue]) -> list[dict[str, Any]]:
    bands: list[dict[str, Any]] = []
    for entry in split_list(text):
        match = _BAND.match(entry)
        if not match:
            issues.append(Issue(path, f"cannot read {entry!r}: write VALUE>N, VALUE>=N or VALUE"))
            continue
        value, operator, number = match.groups()
        band: dict[str, Any] = {}
        if operator:
            band["above" if operator == ">" else "at_least"] = _number(number)
        band["value"] = value
        bands.append(band)
    return bands


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _texts(zh: str, en: str) -> dict[str, str]:
    return {"zh": zh, "en": en}


def definition_from_draft(draft: Draft) -> tuple[dict[str, Any], list[Issue]]:
    """The definition the rows describe, and what could not be read from them (paths as
    in the definition). Schema validation is separate (scenarios_admin.schema)."""
    issues: list[Issue] = []
    s = draft.scenario
    fields: dict[str, dict[str, Any]] = {}
    for row in draft.fields:
        name = row["name"]
        path = f"fields.{name}"
        if name in fields:
            issues.append(Issue(path, "the field is listed twice"))
            continue
        spec: dict[str, Any] = {
            "label": _texts(row["label_zh"], row["label_en"]),
            "type": row["type"],
            "priority": row["priority"],
        }
        if row["ask_zh"] or row["ask_en"]:
            spec["ask"] = _texts(row["ask_zh"], row["ask_en"])
        if row["kinds"]:
            spec["kinds"] = split_list(row["kinds"])
        if row["default"]:
            spec["default"] = row["default"]
        if row["measure_units"] or row["measure_bands"]:
            spec["measure"] = {
                "units": split_list(row["measure_units"]),
                "bands": _bands(row["measure_bands"], f"{path}.measure.bands", issues),
            }
        fields[name] = spec
    for row in draft.values:
        path = f"fields.{row['field']}.values.{row['value']}"
        owner = fields.get(row["field"])
        if owner is None:
            issues.append(Issue(path, f"{row['field']!r} is not a field of this scenario"))
            continue
        values = owner.setdefault("values", {})
        if row["value"] in values:
            issues.append(Issue(path, "the value is listed twice"))
            continue
        value_spec: dict[str, Any] = {}
        if row["label_zh"] or row["label_en"]:
            value_spec["label"] = _texts(row["label_zh"], row["label_en"])
        value_spec["synonyms"] = split_list(row["synonyms"])
        if split_list(row["fallback"]):
            value_spec["fallback"] = split_list(row["fallback"])
        values[row["value"]] = value_spec

    definition = {
        "slug": s["slug"],
        "name": _texts(s["name_zh"], s["name_en"]),
        "kind": s["kind"],
        "system_prompt": s["system_prompt"],
        "field_order": list(fields),
        "fields": fields,
        "report_template": _texts(s["report_template_zh"], s["report_template_en"]),
    }
    # The kind's own parts (the apron's rules, impact, actions, compliance and examples),
    # read by its pack from its rows.
    pack = row_pack(str(s["kind"]))
    if pack is not None and pack.draft_definition is not None:
        definition.update(pack.draft_definition(draft, fields, issues))
    budget = {
        key: (float(s[f"budget_{key}"]) if key == "cost" else s[f"budget_{key}"])
        for key in ("steps", "tokens", "cost")
        if s.get(f"budget_{key}") is not None
    }
    if budget:
        definition["budget"] = budget
    return definition, issues


def read_args(text: str, path: str, issues: list[Issue]) -> dict[str, str]:
    args: dict[str, str] = {}
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        match = _ARG.match(line)
        if not match:
            issues.append(Issue(path, f"line {number}: {line.strip()!r} is not name=value"))
            continue
        name, value = match.group(1), match.group(2).strip()
        if name in args:
            issues.append(Issue(f"{path}.{name}", "given twice"))
        args[name] = value
    return args


def read_expected(
    text: str, fields: dict[str, dict[str, Any]], path: str, issues: list[Issue]
) -> dict[str, Any]:
    expected: dict[str, Any] = {}
    for entry in split_list(text):
        name, equals, raw = entry.partition("=")
        name, raw = name.strip(), raw.strip()
        if not equals or not name:
            issues.append(Issue(path, f"cannot read {entry!r}: write field=value"))
            continue
        field_type = fields.get(name, {}).get("type")
        value: Any = raw
        if field_type == "bool" and raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        elif field_type == "number":
            try:
                value = _number(raw)
            except ValueError:
                value = raw
        expected[name] = value
    return expected


# --- definition -> rows -----------------------------------------------------------------


def draft_from_definition(definition: dict[str, Any]) -> Draft:
    """The rows a (valid) definition is edited as."""
    templates = definition["report_template"]
    draft = Draft(
        {
            "slug": definition["slug"],
            "name_zh": definition["name"]["zh"],
            "name_en": definition["name"]["en"],
            "kind": definition["kind"],
            "system_prompt": definition.get("system_prompt", ""),
            "report_template_zh": templates["zh"],
            "report_template_en": templates["en"],
            **{
                f"budget_{key}": (definition.get("budget") or {}).get(key)
                for key in ("steps", "tokens", "cost")
            },
        }
    )
    for name in definition["field_order"]:
        spec = definition["fields"][name]
        ask = spec.get("ask", {})
        measure = spec.get("measure", {})
        draft.fields.append(
            {
                "name": name,
                "label_zh": spec["label"]["zh"],
                "label_en": spec["label"]["en"],
                "type": spec["type"],
                "priority": spec["priority"],
                "ask_zh": ask.get("zh", ""),
                "ask_en": ask.get("en", ""),
                "kinds": ", ".join(spec.get("kinds", [])),
                "default": spec.get("default", ""),
                "measure_units": ", ".join(measure.get("units", [])),
                "measure_bands": ", ".join(_band_text(b) for b in measure.get("bands", [])),
            }
        )
        for value, value_spec in (spec.get("values") or {}).items():
            label = value_spec.get("label", {})
            draft.values.append(
                {
                    "field": name,
                    "value": value,
                    "label_zh": label.get("zh", ""),
                    "label_en": label.get("en", ""),
                    "synonyms": ", ".join(value_spec.get("synonyms", [])),
                    "fallback": ", ".join(value_spec.get("fallback", [])),
                }
            )
    pack = row_pack(str(definition["kind"]))
    if pack is not None and pack.definition_draft is not None:
        columns, parts = pack.definition_draft(definition)
        draft.scenario.update(columns)
        for part, rows in parts.items():
            draft.part(part).extend(rows)
    return draft


def _band_text(band: dict[str, Any]) -> str:
    if "above" in band:
        return f"{band['value']}>{band['above']}"
    if "at_least" in band:
        return f"{band['value']}>={band['at_least']}"
    return str(band["value"])


def scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
