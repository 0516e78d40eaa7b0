from __future__ import annotations

from typing import Any

from django.conf import settings

from aero.roles import DECIDE_APPROVALS, has_role
from approvals.models import RISK_ORDER, Approval, ManualTodo
from diagnosis.models import Restriction
from diagnosis.presenters import impact_map
from scenarios_admin.airport import load_active_graph
from scenarios_admin.models import Scenario

RISK_CLASSES = ("R1", "R2", "R3")


def clean_filters(risk: str, scenario: str) -> tuple[str, str]:
    """Unknown filter values are ignored (shown as "all"), never an error page."""
    risk = risk if risk in RISK_CLASSES else ""
    scenario = scenario if Scenario.objects.filter(slug=scenario).exists() else ""
    return risk, scenario


def queue_context(user: Any, risk: str = "", scenario: str = "") -> dict[str, Any]:
    """Every open approval across sessions: highest risk class first, newest first within."""
    risk, scenario = clean_filters(risk, scenario)
    # A deleted session's approvals were closed when it was deleted; the filter keeps the
    # queue clean even for rows written before that rule.
    approvals = (
        Approval.objects.open()
        .filter(session__deleted_at__isnull=True)
        .select_related(
            "session__scenario",
            "session__scenario_version",
            "session__created_by",
            "tool_call",
            "first_approved_by",
        )
    )
    if risk:
        approvals = approvals.filter(risk_class=risk)
    if scenario:
        approvals = approvals.filter(session__scenario__slug=scenario)
    ordered = sorted(
        approvals, key=lambda a: (-RISK_ORDER[a.risk_class], -a.created_at.timestamp())
    )
    graph = load_active_graph() if ordered else None
    restrictions = list(Restriction.objects.filter(lifted_at__isnull=True)) if ordered else []
    items = []
    for approval in ordered:
        snapshot = approval.session.snapshot
        items.append(
            {
                "a": approval,
                "session": approval.session,
                "risk": snapshot.get("risk"),
                "impact": snapshot.get("impact"),
                "map": impact_map(graph, snapshot.get("impact"), restrictions) if graph else None,
            }
        )
    return {
        "items": items,
        "risk": risk,
        "scenario": scenario,
        "risk_classes": RISK_CLASSES,
        "scenarios": Scenario.objects.filter(is_active=True),
        "can_decide": has_role(user, DECIDE_APPROVALS),
        "two_person_rule": settings.AERO_TWO_PERSON_RULE,
    }


def todo_context() -> dict[str, Any]:
    todos = ManualTodo.objects.filter(session__deleted_at__isnull=True).select_related(
        "session", "resolved_by", "approval"
    )
    return {
        "open": [t for t in todos if t.is_open],
        "resolved": [t for t in todos if not t.is_open][:50],
    }
