"""The apron draft's rows of its own (the core keeps the fields and their values): what
the scenario admin's row editor, the YAML import and load_builtin read and write, as
(model, columns) per part of scenarios_admin.draft.Draft, in the order rows are written."""

from __future__ import annotations

from typing import Any

from packs.airport.models import RiskRule, ScenarioAction, ScenarioExample, SpreadRadius

DRAFT_ROWS: dict[str, tuple[type[Any], tuple[str, ...]]] = {
    "rules": (RiskRule, ("rule_id", "condition", "level", "score")),
    "radii": (SpreadRadius, ("key_value", "level", "hops")),
    "actions": (ScenarioAction, ("tool", "risk_class", "condition", "for_each", "args")),
    "examples": (ScenarioExample, ("text", "expected_fields", "rule", "level", "actions")),
}
