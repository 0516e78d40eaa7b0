"""Helpers for the tests of the data-only scenarios: the policy without a database, and
`manage.py incident run` end to end."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.management import call_command

from packs.airport.agent import policy
from packs.airport.agent.extraction import extract_fields
from packs.airport.models import Restriction
from tests.builtin_data import builtin_definition, demo_graph


def extract(slug: str, text: str, asked: str | None = None) -> dict[str, Any]:
    found = extract_fields(builtin_definition(slug), text, demo_graph(), asked)
    return {name: extraction.value for name, extraction in found.items()}


def assess(slug: str, fields: dict[str, Any]) -> dict[str, Any]:
    definition = builtin_definition(slug)
    return policy.assess_risk(definition, policy.with_defaults(definition, fields), demo_graph())


def plan(slug: str, fields: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[Any]]:
    """Risk, impact and the required actions as (tool, class, args without message)."""
    definition, graph = builtin_definition(slug), demo_graph()
    fields = policy.with_defaults(definition, fields)
    risk = policy.assess_risk(definition, fields, graph)
    impact = policy.analyze_impact(definition, fields, graph, risk["level"])
    actions = policy.required_actions(definition, fields, graph, risk, impact)
    return (
        risk,
        impact,
        [
            (a["tool"], a["risk_class"], {k: v for k, v in a["args"].items() if k != "message"})
            for a in actions
        ],
    )


def synonym_cases(slug: str) -> list[Any]:
    """Every synonym (and fallback) of every enum/bool field of a shipped scenario."""
    cases = []
    for name, spec in builtin_definition(slug)["fields"].items():
        if spec["type"] not in ("enum", "bool"):
            continue
        for raw, value_spec in spec["values"].items():
            expected = raw == "true" if spec["type"] == "bool" else raw
            for synonym in [*value_spec.get("synonyms", []), *value_spec.get("fallback", [])]:
                cases.append(
                    pytest.param(name, str(synonym), expected, id=f"{name}={raw}:{synonym}")
                )
    return cases


def run_incident(
    capsys: pytest.CaptureFixture[str], slug: str, message: str, *options: str
) -> dict[str, Any]:
    capsys.readouterr()
    call_command("incident", "run", "--scenario", slug, "--message", message, *options, "--json")
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def action_table(result: dict[str, Any]) -> list[tuple[str, dict[str, str], str, str, str]]:
    return [
        (
            a["tool"],
            {k: v for k, v in a["args"].items() if k != "message"},
            a["risk_class"],
            a["decision"],
            a["status"],
        )
        for a in result["actions"]
    ]


def active_restrictions() -> set[tuple[str, str]]:
    return set(Restriction.objects.filter(lifted_at__isnull=True).values_list("kind", "target"))
