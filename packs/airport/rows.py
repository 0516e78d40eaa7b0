"""The apron draft's rows of its own (the core keeps the fields and their values): what
the scenario admin's row editor, the YAML import and load_builtin read and write, as
(model, columns) per part of scenarios_admin.draft.Draft, in the order rows are written;
how those rows and the definition's own parts (risk rules, the impact with its spread
radius, actions, compliance states, examples) are read from each other; and where the row
editor shows a problem of one of those parts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django import forms
from django.db.models import Field

from aero.packs import action_args
from packs.airport.models import (
    ApronDraft,
    RiskRule,
    ScenarioAction,
    ScenarioExample,
    SpreadRadius,
)
from scenarios_admin.admin_check import place_problem
from scenarios_admin.conditions import condition_text
from scenarios_admin.definition import Issue
from scenarios_admin.draft import (
    Draft,
    read_args,
    read_condition,
    read_expected,
    scalar_text,
    split_list,
)

SETTINGS_COLUMNS = ("impact_start", "radius_key", "default_radius", "compliance_states")
DRAFT_ROWS: dict[str, tuple[type[Any], tuple[str, ...]]] = {
    # One row (ApronDraft): the scenario's apron settings.
    "settings": (ApronDraft, SETTINGS_COLUMNS),
    "rules": (RiskRule, ("rule_id", "condition", "level", "score")),
    "radii": (SpreadRadius, ("key_value", "level", "hops")),
    "actions": (ScenarioAction, ("tool", "risk_class", "condition", "for_each", "args")),
    "examples": (ScenarioExample, ("text", "expected_fields", "rule", "level", "actions")),
}


# --- rows -> definition -----------------------------------------------------------------


def definition_parts(
    draft: Draft, fields: dict[str, dict[str, Any]], issues: list[Issue]
) -> dict[str, Any]:
    """The definition's apron parts the rows describe (`fields`: as the core read them),
    adding to `issues` what could not be read (paths as in the definition)."""
    s = settings_of(draft)
    rules = [
        {
            "id": row["rule_id"],
            "when": read_condition(row["condition"], f"risk_rules[{i}].when", issues),
            "level": row["level"],
            "score": row["score"],
        }
        for i, row in enumerate(draft.part("rules"))
    ]

    impact: dict[str, Any] = {"start": s["impact_start"]}
    key_field = s["radius_key"]
    if key_field:
        impact["radius_key"] = key_field
    radius: dict[str, Any] = {}
    for row in draft.part("radii"):
        value, level = row["key_value"], row["level"]
        if key_field and not value:
            issues.append(Issue("impact.radius", f"a row without a value of {key_field}"))
            continue
        if not key_field and value:
            issues.append(
                Issue(
                    f"impact.radius.{value}",
                    "a row names a value but the radius depends on no field: choose the "
                    "field or leave the value empty",
                )
            )
            continue
        table = radius.setdefault(value, {}) if key_field else radius
        if level in table:
            where = f"impact.radius.{value}.{level}" if key_field else f"impact.radius.{level}"
            issues.append(Issue(where, "listed twice"))
            continue
        table[level] = row["hops"]
    impact["radius"] = radius
    impact["default_radius"] = s["default_radius"]

    actions = []
    for i, row in enumerate(draft.part("actions")):
        action: dict[str, Any] = {"tool": row["tool"], "risk_class": row["risk_class"]}
        if row["for_each"]:
            action["for_each"] = row["for_each"]
        action["when"] = read_condition(row["condition"], f"actions[{i}].when", issues)
        action["args"] = read_args(row["args"], f"actions[{i}].args", issues)
        actions.append(action)

    examples = [
        {
            "text": row["text"],
            "fields": read_expected(
                row["expected_fields"], fields, f"examples[{i}].fields", issues
            ),
            "rule": row["rule"],
            "level": row["level"],
            "actions": split_list(row["actions"]),
        }
        for i, row in enumerate(draft.part("examples"))
    ]
    return {
        "risk_rules": rules,
        "impact": impact,
        "actions": actions,
        "compliance": {"states": list(s["compliance_states"] or [])},
        "examples": examples,
    }


def settings_of(draft: Draft) -> dict[str, Any]:
    """The draft's settings row; a draft without one (a scenario added without it) reads
    as the model's defaults."""
    rows = draft.part("settings")
    if rows:
        return rows[0]
    defaults = {}
    for column in SETTINGS_COLUMNS:
        model_field = ApronDraft._meta.get_field(column)
        defaults[column] = model_field.get_default() if isinstance(model_field, Field) else None
    return defaults


# --- definition -> rows -----------------------------------------------------------------


def draft_parts(definition: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The scenario's columns of the apron's own (none: its settings are a row) and the
    rows of its parts that a (valid) definition is edited as."""
    impact = definition["impact"]
    settings = {
        "impact_start": impact["start"],
        "radius_key": impact.get("radius_key", ""),
        "default_radius": impact.get("default_radius", 1),
        "compliance_states": list(definition["compliance"]["states"]),
    }
    rules = [
        {
            "rule_id": rule["id"],
            "condition": condition_text(rule.get("when", {})),
            "level": rule["level"],
            "score": rule["score"],
        }
        for rule in definition["risk_rules"]
    ]
    radii = []
    if impact.get("radius_key"):
        for value, by_level in impact.get("radius", {}).items():
            for level, hops in by_level.items():
                radii.append({"key_value": value, "level": level, "hops": hops})
    else:
        for level, hops in impact.get("radius", {}).items():
            radii.append({"key_value": "", "level": level, "hops": hops})
    actions = []
    for action in definition["actions"]:
        args = action.get("args", {})
        names = [a for a in action_args(action["tool"]) if a in args]
        names += [a for a in args if a not in names]
        actions.append(
            {
                "tool": action["tool"],
                "risk_class": action["risk_class"],
                "condition": condition_text(action.get("when", {})),
                "for_each": action.get("for_each", ""),
                "args": "\n".join(f"{name}={args[name]}" for name in names),
            }
        )
    examples = [
        {
            "text": example["text"],
            "expected_fields": ", ".join(
                f"{name}={scalar_text(value)}" for name, value in example["fields"].items()
            ),
            "rule": example["rule"],
            "level": example["level"],
            "actions": ", ".join(example["actions"]),
        }
        for example in definition.get("examples", [])
    ]
    return {}, {
        "settings": [settings],
        "rules": rules,
        "radii": radii,
        "actions": actions,
        "examples": examples,
    }


# --- where the row editor shows a problem ---------------------------------------------------

# Where a path of the definition is edited: the settings row's column per leading key.
SETTINGS_PATHS = {
    "impact.start": "impact_start",
    "impact.radius_key": "radius_key",
    "impact.default_radius": "default_radius",
    "compliance.states": "state_1",
}
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
_INDEXED = re.compile(r"^(risk_rules|actions|examples)\[(\d+)\](?:\.(.*))?$")
_PARTS = {"risk_rules": "rules", "actions": "actions", "examples": "examples"}


def _column(rest: str, columns: dict[str, str]) -> str | None:
    for prefix in sorted(columns, key=len, reverse=True):
        if rest == prefix or rest.startswith((prefix + ".", prefix + "[")):
            return columns[prefix]
    return None


def place_issue(issue: Issue, form: forms.BaseForm, live: Mapping[str, list[Any]]) -> str | None:
    """Mark a problem of the apron's parts on the row (or the settings' column) that
    edits it and say where it is; None for a path of none of them."""
    path, message = issue.path, issue.message
    # The settings row's form, else (no row on the page) the scenario's.
    settings = (live.get("settings") or [form])[0]
    if path in SETTINGS_PATHS or any(path.startswith(p + ".") for p in SETTINGS_PATHS):
        key = next(p for p in sorted(SETTINGS_PATHS, key=len, reverse=True) if path.startswith(p))
        verbose = "compliance states" if key == "compliance.states" else ""
        return place_problem(settings, SETTINGS_PATHS[key], message, "Scenario", verbose)
    match = _INDEXED.match(path)
    if match:
        part, index, rest = match.group(1), int(match.group(2)), match.group(3) or ""
        rows = live[_PARTS[part]]
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
    if path.startswith("impact.radius"):
        radii = {(f.cleaned_data["key_value"], f.cleaned_data["level"]): f for f in live["radii"]}
        suffix = path[len("impact.radius.") :] if path.startswith("impact.radius.") else ""
        for (value, level), row in radii.items():
            row_path = f"{value}.{level}" if value else level
            if suffix and (row_path == suffix or row_path.startswith(suffix + ".")):
                column = "hops" if row_path == suffix else "key_value"
                return place_problem(row, column, message, "Spread radius")
        return place_problem(settings, "radius_key", message, "Spread radius")
    return None
