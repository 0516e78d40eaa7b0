"""An apron scenario's self-check: its example cases run through the offline provider and
the deterministic policy (extraction -> risk rules -> impact -> required actions), exactly as
a session would, without an LLM and without writing anything.

`manage.py scenario check SLUG` prints the results; publishing in the admin runs the
same check (diagnosis.selfcheck, through the pack's `check_draft`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diagnosis.agent.providers import OfflineProvider
from packs.airport.agent import policy
from packs.airport.graph import AirportGraph
from packs.airport.world import load_active_graph

NOT_KNOWN = "(not recognised)"


@dataclass
class CaseResult:
    number: int  # 1-based, as an admin counts the example rows
    text: str
    problems: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)
    rule: str = ""
    level: str = ""
    actions: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        outcome = f"{self.rule} {self.level} [{', '.join(self.actions)}]" if self.rule else "—"
        return f"{self.text} -> {outcome}"


def check_draft(definition: dict[str, Any]) -> list[CaseResult]:
    """The definition's example cases on the active airport (LookupError without one)."""
    return check_examples(definition, load_active_graph())


def check_examples(definition: dict[str, Any], graph: AirportGraph) -> list[CaseResult]:
    return [
        run_case(definition, graph, number, example)
        for number, example in enumerate(definition.get("examples", []), start=1)
    ]


def run_case(
    definition: dict[str, Any], graph: AirportGraph, number: int, example: dict[str, Any]
) -> CaseResult:
    result = CaseResult(number, example["text"])
    found, _ = OfflineProvider().extract(definition, example["text"], graph, None)
    fields = policy.with_defaults(definition, {name: e.value for name, e in found.items()})
    result.fields = fields
    expected = example["fields"]
    for name in definition["field_order"]:
        want, got = expected.get(name), fields.get(name)
        if (
            name not in expected
            and got is not None
            and definition["fields"][name].get("default") != got
        ):
            result.problems.append(f"field {name}: got {_show(got)}, the example expects none")
        elif name in expected and (got != want or type(got) is not type(want)):
            result.problems.append(f"field {name}: expected {_show(want)}, got {_show(got)}")
    missing = policy.missing_p1(definition, fields)
    if missing:
        result.problems.append("P1 fields not recognised: " + ", ".join(missing))
        return result
    try:
        risk = policy.assess_risk(definition, fields, graph)
        impact = policy.analyze_impact(definition, fields, graph, risk["level"])
    except LookupError as exc:
        result.problems.append(str(exc))
        return result
    proposals = policy.required_actions(definition, fields, graph, risk, impact)
    result.rule, result.level = risk["rule"], risk["level"]
    result.actions = [p["tool"] for p in proposals]
    if result.rule != example["rule"]:
        result.problems.append(f"rule: expected {example['rule']}, got {result.rule}")
    if result.level != example["level"]:
        result.problems.append(f"level: expected {example['level']}, got {result.level}")
    if result.actions != example["actions"]:
        result.problems.append(
            f"actions: expected [{', '.join(example['actions'])}], "
            f"got [{', '.join(result.actions)}]"
        )
    return result


def _show(value: Any) -> str:
    if value is None:
        return NOT_KNOWN
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
