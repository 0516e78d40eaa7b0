from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.models import Count, Min

from aero.roles import DECIDE_APPROVALS, user_roles
from approvals.models import RISK_ORDER, Approval, ManualTodo
from diagnosis.consequences import board_of
from diagnosis.models import Restriction
from diagnosis.presenters import impact_map
from scenarios_admin.airport import load_active_graph
from scenarios_admin.definition import restriction_of
from scenarios_admin.models import Scenario

RISK_CLASSES = ("R1", "R2", "R3")
# Incidents a page, each with all its open approvals: a page of every open approval
# can be megabytes during a big event; an incident proposes a handful.
QUEUE_PAGE = 20


def clean_filters(risk: str, scenario: str) -> tuple[str, str]:
    """Unknown filter values are ignored (shown as "all"), never an error page."""
    risk = risk if risk in RISK_CLASSES else ""
    scenario = scenario if Scenario.objects.filter(slug=scenario).exists() else ""
    return risk, scenario


# An incident's place in the queue: nearest deadline first; incidents with no deadline
# at all (only lift requests, which never time out) after every timed one, as PostgreSQL
# sorts NULLs last. Sorted in Python: SQLite (the embedded default) sorts NULLs first.
IncidentKey = tuple[bool, datetime, UUID]
NO_DEADLINE = "none"


def incident_key(nearest: datetime | None, session_id: UUID) -> IncidentKey:
    return (nearest is None, nearest or datetime.min.replace(tzinfo=UTC), session_id)


def incident_cursor(nearest: datetime | None, session_id: UUID) -> str:
    """The `after` value naming an incident: "<nearest deadline, ISO, or none>~<session id>"."""
    return f"{nearest.isoformat() if nearest else NO_DEADLINE}~{session_id}"


def parse_incident_cursor(after: str) -> IncidentKey | None:
    """`after` as incident_cursor writes it; anything else means the first page (never an
    error page)."""
    moment, _, session = after.partition("~")
    try:
        if moment == NO_DEADLINE:
            return incident_key(None, UUID(session))
        parsed = datetime.fromisoformat(moment)
        return incident_key(parsed, UUID(session)) if parsed.tzinfo else None
    except ValueError:
        return None


def queue_context(
    user: Any,
    risk: str = "",
    scenario: str = "",
    after: str = "",
    *,
    roles: frozenset[str] | None = None,
) -> dict[str, Any]:
    """One page of open approvals across sessions, paged by incident: the
    incidents whose nearest deadline comes first, QUEUE_PAGE incidents a page, each with
    all its open approvals (that match the filters), so an incident is never split over
    two pages. Keyset on (nearest deadline, session id): `after` names the last incident
    of the previous page. One grouped query lists the open incidents (it also gives the
    open count), one reads the page's approvals.
    `roles` instead of `user`: the live consumer renders for a role set."""
    risk, scenario = clean_filters(risk, scenario)
    # A deleted session's approvals were closed when it was deleted; the filter keeps the
    # queue clean even for rows written before that rule.
    approvals = Approval.objects.open().filter(session__deleted_at__isnull=True)
    if risk:
        approvals = approvals.filter(risk_class=risk)
    if scenario:
        approvals = approvals.filter(session__scenario__slug=scenario)
    cursor = parse_incident_cursor(after)
    # One row per open incident (a few dozen, however many actions they propose): the
    # open count is their sum, and the page the next QUEUE_PAGE after the cursor.
    incidents = sorted(
        approvals.order_by()
        .values("session_id")
        .annotate(nearest=Min("deadline"), open=Count("id")),
        key=lambda row: incident_key(row["nearest"], row["session_id"]),
    )
    open_count = sum(row["open"] for row in incidents)
    if cursor is not None:
        incidents = [
            row for row in incidents if incident_key(row["nearest"], row["session_id"]) > cursor
        ]
    incident_page = incidents[: QUEUE_PAGE + 1]
    more = len(incident_page) > QUEUE_PAGE
    incident_page = incident_page[:QUEUE_PAGE]
    order = {row["session_id"]: n for n, row in enumerate(incident_page)}
    page = (
        list(
            approvals.filter(session_id__in=list(order)).select_related(
                "session__scenario",
                "session__created_by",
                "tool_call",
                "first_approved_by",
                "edited_by",
            )
        )
        if order
        else []
    )
    graph = load_active_graph() if page else None
    restrictions = list(Restriction.objects.filter(lifted_at__isnull=True)) if page else []
    board = board_of(graph, restrictions) if graph else None
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
                "consequence": board.consequence(
                    call.tool_name, call.request_payload, approval.session_id
                )
                if board
                else None,
            }
        )
    viewer_roles = roles if roles is not None else user_roles(user)
    groups = sorted(incident_groups(items), key=lambda g: order[g["session"].pk])
    for group in groups:
        group["map"] = impact_map(graph, group["impact"], restrictions) if graph else None
    last = incident_page[-1] if incident_page else None
    return {
        "items": [item for group in groups for item in group["items"]],
        "groups": groups,
        "open_count": open_count,
        "after": after if cursor is not None else "",
        "next_after": incident_cursor(last["nearest"], last["session_id"]) if more and last else "",
        "risk": risk,
        "scenario": scenario,
        "risk_classes": RISK_CLASSES,
        "scenarios": Scenario.objects.filter(is_active=True),
        "can_decide": bool(viewer_roles & set(DECIDE_APPROVALS)),
        "two_person_rule": settings.AERO_TWO_PERSON_RULE,
    }


def incident_groups(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's approvals grouped by incident (session): the session, risk and impact
    shown once per incident, not once per action. Incidents whose nearest
    deadline comes first lead, then the highest risk class; within an incident the
    same order. The page is a keyset page of incidents (queue_context)."""
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
