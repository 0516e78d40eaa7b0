"""A scenario's self-check: its example cases run through the offline provider and the
deterministic policy (extraction -> risk rules -> impact -> required actions), exactly as
a session would, without an LLM and without writing anything.

`manage.py scenario check SLUG` prints the results; publishing in the admin runs the
same check through scenarios_admin.signals.publish_check (scenarios_admin may not import
this app, so this app registers itself there in DiagnosisConfig.ready)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aero.packs import UnknownDomain, pack_for
from diagnosis.agent import policy
from diagnosis.agent.providers import OfflineProvider
from scenarios_admin.airport import AirportGraph, load_active_graph
from scenarios_admin.definition import below_floor, floor_message

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


def _own_check(kind: Any) -> Callable[[dict[str, Any]], list[Any]] | None:
    try:
        return pack_for(str(kind)).check_examples
    except UnknownDomain:
        return None


def _show(value: Any) -> str:
    if value is None:
        return NOT_KNOWN
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def publish_check(sender: Any, definition: dict[str, Any], **kwargs: Any) -> list[str]:
    """Receiver of scenarios_admin.signals.publish_check: one line per action below its
    risk floor (validation refuses those too: publishing never trusts one check alone),
    then one line per failing case."""
    floors = [
        f"actions[{i}].risk_class: {floor_message(a['tool'], a['risk_class'])}"
        for i, a in enumerate(definition.get("actions", []))
        if below_floor(a["tool"], a["risk_class"])
    ]
    if floors:
        return floors
    own_check = _own_check(definition.get("kind"))
    if own_check is not None:
        # A pack with its own example cases (the diagnosis bundles) checks them itself.
        return [
            f"example {case.number} ({case.summary()}): {'; '.join(case.problems)}"
            for case in own_check(definition)
            if not case.passed
        ]
    examples = definition.get("examples", [])
    if not examples:
        return ["no example cases: add at least one (publishing runs them as a self-check)"]
    try:
        graph = load_active_graph()
    except LookupError as exc:
        return [f"the example cases cannot run: {exc}"]
    return [
        f"example {case.number} ({case.text}): {'; '.join(case.problems)}"
        for case in check_examples(definition, graph)
        if not case.passed
    ]
