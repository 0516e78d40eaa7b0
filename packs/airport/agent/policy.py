"""Deterministic scenario policy: risk rules, spread radius, required actions. No LLM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from packs.airport.graph import AirportGraph
from scenarios_admin.definition import effective_risk_class, evaluate, render_args


def p1_fields(definition: dict[str, Any]) -> list[str]:
    return [n for n in definition["field_order"] if definition["fields"][n]["priority"] == "P1"]


def missing_p1(definition: dict[str, Any], fields: dict[str, Any]) -> list[str]:
    return [name for name in p1_fields(definition) if fields.get(name) is None]


def unasked_p2(definition: dict[str, Any], fields: dict[str, Any], asked: list[str]) -> list[str]:
    """P2 fields the scenario wants asked (they carry an ask prompt) that are still empty
    and were never asked: asked once, and any answer moves on ("unknown" leaves it empty)."""
    return [
        name
        for name in definition["field_order"]
        if definition["fields"][name]["priority"] == "P2"
        and definition["fields"][name].get("ask")
        and fields.get(name) is None
        and name not in asked
    ]


def with_defaults(definition: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    merged = dict(fields)
    for name, spec in definition["fields"].items():
        if merged.get(name) is None and spec.get("default") is not None:
            merged[name] = spec["default"]
    return merged


def make_lookup(
    definition: dict[str, Any],
    fields: dict[str, Any],
    graph: AirportGraph,
    risk: dict[str, Any] | None = None,
    impact: dict[str, Any] | None = None,
) -> Callable[[str], tuple[bool, Any]]:
    def lookup(key: str) -> tuple[bool, Any]:
        if key == "level":
            return (risk is not None, risk["level"] if risk else None)
        if key.startswith("impact."):
            return (impact is not None, impact.get(key[7:], []) if impact else None)
        name, _, attribute = key.partition(".")
        value = fields.get(name)
        if value is None:
            return (False, None)
        if attribute == "kind":
            node = graph.resolve(str(value))
            return (node is not None, node.kind if node else None)
        return (True, value)

    return lookup


def assess_risk(
    definition: dict[str, Any], fields: dict[str, Any], graph: AirportGraph
) -> dict[str, Any]:
    """First matching rule wins; the last rule is unconditional (validated)."""
    lookup = make_lookup(definition, fields, graph)
    for rule in definition["risk_rules"]:
        if evaluate(rule.get("when", {}), lookup):
            return {
                "rule": rule["id"],
                "level": rule["level"],
                "score": rule["score"],
                "when": rule.get("when", {}),
            }
    raise LookupError("no risk rule matched")  # unreachable for a validated definition


def spread_radius(definition: dict[str, Any], fields: dict[str, Any], level: str) -> int:
    impact = definition["impact"]
    table = impact.get("radius", {})
    key_field = impact.get("radius_key")
    if key_field:
        table = table.get(str(fields.get(key_field)), {})
    return int(table.get(level, impact.get("default_radius", 1)))


def analyze_impact(
    definition: dict[str, Any], fields: dict[str, Any], graph: AirportGraph, level: str
) -> dict[str, Any]:
    start_ref = str(fields[definition["impact"]["start"]])
    node = graph.resolve(start_ref)
    if node is None:
        raise LookupError(f"position {start_ref!r} is not a node of {graph.icao}")
    return graph.impact(node.node_id, spread_radius(definition, fields, level))


def required_actions(
    definition: dict[str, Any],
    fields: dict[str, Any],
    graph: AirportGraph,
    risk: dict[str, Any],
    impact: dict[str, Any],
) -> list[dict[str, Any]]:
    """The response actions the policy requires, in definition order, each with a stable
    call id (tool + arguments) so a re-run proposes the very same calls."""
    lookup = make_lookup(definition, fields, graph, risk, impact)
    proposals: list[dict[str, Any]] = []
    for spec in definition["actions"]:
        if not evaluate(spec.get("when", {}), lookup):
            continue
        items: list[Any] = [None]
        if spec.get("for_each"):
            items = list(impact.get(spec["for_each"][len("impact.") :], []))
        for item in items:

            def resolve(path: str, item: Any = item) -> Any:
                head, _, rest = path.partition(".")
                if head == "item":
                    return item
                if head == "fields":
                    return fields.get(rest)
                if head == "risk":
                    return risk.get(rest)
                if head == "impact":
                    return impact.get(rest)
                return None

            args = render_args(spec.get("args", {}), resolve)
            suffix = ":".join(f"{k}={v}" for k, v in sorted(args.items()) if k != "message")
            proposals.append(
                {
                    "call_id": f"action:{spec['tool']}" + (f":{suffix}" if suffix else ""),
                    "tool": spec["tool"],
                    "args": args,
                    # A version published before the floors existed may still say less.
                    "risk_class": effective_risk_class(spec["tool"], spec["risk_class"]),
                    "is_action": True,
                }
            )
    return proposals
