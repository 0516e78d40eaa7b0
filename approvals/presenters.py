from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Q

from aero.roles import DECIDE_APPROVALS, user_roles
from approvals.models import RISK_ORDER, Approval, ManualTodo
from diagnosis.consequences import Board
from diagnosis.models import Restriction
from diagnosis.presenters import impact_map
from scenarios_admin.airport import load_active_graph
from scenarios_admin.definition import restriction_of
from scenarios_admin.models import Scenario

RISK_CLASSES = ("R1", "R2", "R3")
QUEUE_PAGE = 50  # ~2,000 open approvals once made a 15 MB page that took 20 s


def clean_filters(risk: str, scenario: str) -> tuple[str, str]:
    """Unknown filter values are ignored (shown as "all"), never an error page."""
    risk = risk if risk in RISK_CLASSES else ""
    scenario = scenario if Scenario.objects.filter(slug=scenario).exists() else ""
    return risk, scenario


def queue_context(
    user: Any,
    risk: str = "",
    scenario: str = "",
    after: str = "",
    *,
    roles: frozenset[str] | None = None,
) -> dict[str, Any]:
    """One page of open approvals across sessions: highest risk class first, newest
    first within (R3 > R2 > R1 also sorts as text). Keyset pagination: `after` is the id
    of the last approval of the previous page, so a page costs the same however deep.
    `roles` instead of `user`: the live consumer renders for a role set."""
    risk, scenario = clean_filters(risk, scenario)
    # A deleted session's approvals were closed when it was deleted; the filter keeps the
    # queue clean even for rows written before that rule.
    approvals = Approval.objects.open().filter(session__deleted_at__isnull=True)
    if risk:
        approvals = approvals.filter(risk_class=risk)
    if scenario:
        approvals = approvals.filter(session__scenario__slug=scenario)
    open_count = approvals.count()
    anchor = (
        Approval.objects.filter(pk=int(after)).values_list("risk_class", "created_at").first()
        if after.isdigit()
        else None
    )
    if anchor is not None:
        risk_class, created_at = anchor
        approvals = approvals.filter(
            Q(risk_class__lt=risk_class)
            | Q(risk_class=risk_class, created_at__lt=created_at)
            | Q(risk_class=risk_class, created_at=created_at, pk__lt=int(after))
        )
    page = list(
        approvals.select_related(
            "session__scenario", "session__created_by", "tool_call", "first_approved_by"
        ).order_by("-risk_class", "-created_at", "-pk")[: QUEUE_PAGE + 1]
    )
    more = len(page) > QUEUE_PAGE
    page = page[:QUEUE_PAGE]
    graph = load_active_graph() if page else None
    restrictions = list(Restriction.objects.filter(lifted_at__isnull=True)) if page else []
    board = Board(graph, restrictions) if graph else None
    items = []
    for approval in page:
        snapshot = approval.session.snapshot
        call = approval.tool_call
        items.append(
            {
                "a": approval,
                "session": approval.session,
                "risk": snapshot.get("risk"),
                "impact": snapshot.get("impact"),
                "seconds_left": approval.seconds_left(),
                "consequence": board.consequence(call.tool_name, call.request_payload)
                if board
                else None,
            }
        )
    viewer_roles = roles if roles is not None else user_roles(user)
    groups = incident_groups(items)
    for group in groups:
        group["map"] = impact_map(graph, group["impact"], restrictions) if graph else None
    return {
        "items": items,
        "groups": groups,
        "open_count": open_count,
        "after": after if anchor is not None else "",
        "next_after": str(page[-1].pk) if more else "",
        "risk": risk,
        "scenario": scenario,
        "risk_classes": RISK_CLASSES,
        "scenarios": Scenario.objects.filter(is_active=True),
        "can_decide": bool(viewer_roles & set(DECIDE_APPROVALS)),
        "two_person_rule": settings.AERO_TWO_PERSON_RULE,
    }


def incident_groups(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's approvals grouped by incident (session): the session, risk and impact
    shown once per incident, not once per action (ADR-126). Incidents whose nearest
    deadline comes first lead, then the highest risk class; within an incident the
    same order. The page itself stays the keyset page of the whole queue."""
    groups: dict[Any, dict[str, Any]] = {}
    for item in items:
        group = groups.setdefault(
            item["session"].pk,
            {
                "session": item["session"],
                "risk": item["risk"],
                "impact": item["impact"],
                "items": [],
            },
        )
        group["items"].append(item)
    for group in groups.values():
        # Within an incident the riskiest action leads; its nearest deadline leads the
        # incident among the others.
        group["items"].sort(key=lambda i: (-RISK_ORDER.get(i["a"].risk_class, 0), _urgency(i)))
        group["r1_open"] = [
            i["a"]
            for i in group["items"]
            if i["a"].risk_class == "R1"
            # money and lifts are decided one by one
            and not (i["a"].is_lift or i["a"].is_budget)
        ]
    return sorted(groups.values(), key=lambda g: min(_urgency(i) for i in g["items"]))


def _urgency(item: dict[str, Any]) -> tuple[float, int, int]:
    left = item["seconds_left"]
    return (
        float("inf") if left is None else left,
        -RISK_ORDER.get(item["a"].risk_class, 0),
        item["a"].pk,
    )


TODO_PAGE = 100


def todo_context(after: str = "") -> dict[str, Any]:
    """Open to-dos newest first, a page at a time (keyset on id, which grows with
    created_at), and the 50 most recently resolved. Deleted sessions' to-dos are gone.
    A to-do whose effect is already in force (the taxiway it would close was closed by
    another session) leaves the open list for "already in force" (issue 12)."""
    todos = ManualTodo.objects.filter(session__deleted_at__isnull=True)
    open_todos = todos.filter(resolved_at__isnull=True).select_related(
        "session", "approval__tool_call"
    )
    if after.isdigit():
        open_todos = open_todos.filter(pk__lt=int(after))
    page = list(open_todos.order_by("-pk")[: TODO_PAGE + 1])
    resolved = (
        todos.filter(resolved_at__isnull=False)
        .select_related("session", "resolved_by", "approval")
        .order_by("-resolved_at")[:50]
    )
    in_force_now = {
        (r.kind, r.target): r for r in Restriction.objects.filter(lifted_at__isnull=True)
    }
    shown, in_force = [], []
    for todo in page[:TODO_PAGE]:
        call = todo.approval.tool_call
        todo.restricts = restriction_of(call.tool_name, call.request_payload)  # type: ignore[attr-defined]
        restriction = in_force_now.get(todo.restricts) if todo.restricts else None  # type: ignore[attr-defined]
        if restriction is not None:
            in_force.append({"todo": todo, "restriction": restriction})
        else:
            shown.append(todo)
    return {
        "open": shown,
        "in_force": in_force,
        "after": after if after.isdigit() else "",
        "next_after": str(page[TODO_PAGE - 1].pk) if len(page) > TODO_PAGE else "",
        "resolved": list(resolved),
    }
