from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.models import Count, F, Min, Q, QuerySet, Window
from django.db.models.functions import RowNumber

from aero.roles import DECIDE_APPROVALS, user_roles
from approvals.models import RISK_ORDER, Approval, ManualTodo
from diagnosis.consequences import board_of
from diagnosis.models import Restriction
from diagnosis.presenters import impact_map
from scenarios_admin.airport import load_active_graph
from scenarios_admin.definition import restriction_of
from scenarios_admin.models import Scenario

RISK_CLASSES = ("R1", "R2", "R3")
# Incidents a page, and a page of each incident's open approvals: the page's size is
# bounded whatever the number of approvals (an incident may propose dozens during a big
# event); the rest of an incident's are on its own page (?incident=).
QUEUE_PAGE = 10
INCIDENT_ITEMS = 5
# An incident's own page: its open approvals, this many at most (an incident proposes a
# handful; a runaway one still never renders thousands of cards).
INCIDENT_PAGE = 100


def clean_filters(risk: str, scenario: str) -> tuple[str, str]:
    """Unknown filter values are ignored (shown as "all"), never an error page."""
    risk = risk if risk in RISK_CLASSES else ""
    scenario = scenario if scenario and Scenario.objects.filter(slug=scenario).exists() else ""
    return risk, scenario


def clean_incident(incident: str) -> UUID | None:
    """The ?incident= value (a session id), or None (all incidents) for anything else."""
    try:
        return UUID(incident) if incident else None
    except ValueError:
        return None


# An incident's place in the queue: nearest deadline first; incidents with no deadline
# at all (only lift requests, which never time out) after every timed one (NULLS LAST,
# which SQLite and PostgreSQL both honour when asked).
IncidentKey = tuple[datetime | None, UUID]
NO_DEADLINE = "none"


def incident_cursor(nearest: datetime | None, session_id: UUID) -> str:
    """The `after` value naming an incident: "<nearest deadline, ISO, or none>~<session id>"."""
    return f"{nearest.isoformat() if nearest else NO_DEADLINE}~{session_id}"


def parse_incident_cursor(after: str) -> IncidentKey | None:
    """`after` as incident_cursor writes it; anything else means the first page (never an
    error page)."""
    moment, _, session = after.partition("~")
    try:
        if moment == NO_DEADLINE:
            return (None, UUID(session))
        parsed = datetime.fromisoformat(moment)
        return (parsed, UUID(session)) if parsed.tzinfo else None
    except ValueError:
        return None


def _after(cursor: IncidentKey) -> Q:
    """The incidents after `cursor` in queue order, on the grouped rows (a HAVING)."""
    nearest, session_id = cursor
    if nearest is None:
        return Q(nearest__isnull=True, session_id__gt=session_id)
    return (
        Q(nearest__gt=nearest)
        | Q(nearest=nearest, session_id__gt=session_id)
        | Q(nearest__isnull=True)
    )


def open_incidents(approvals: QuerySet[Approval], cursor: IncidentKey | None) -> QuerySet[Any]:
    """One row per incident of `approvals` (session_id, nearest deadline, open count) in
    queue order, after `cursor`: grouped, sorted and cut in SQL."""
    incidents = (
        approvals.order_by()
        .values("session_id")
        .annotate(nearest=Min("deadline"), open=Count("*"))
        .order_by(F("nearest").asc(nulls_last=True), "session_id")
    )
    return incidents.filter(_after(cursor)) if cursor is not None else incidents


def open_approvals() -> QuerySet[Approval]:
    """The queue's rows: open approvals of sessions not deleted."""
    # A deleted session's approvals were closed when it was deleted; the filter keeps the
    # queue clean even for rows written before that rule.
    return Approval.objects.open().filter(session__deleted_at__isnull=True)


def queue_context(
    user: Any,
    risk: str = "",
    scenario: str = "",
    after: str = "",
    *,
    incident: str = "",
    roles: frozenset[str] | None = None,
) -> dict[str, Any]:
    """One page of open approvals across sessions, paged by incident: the QUEUE_PAGE
    incidents whose nearest deadline comes first, each with its first INCIDENT_ITEMS
    open approvals (that match the filters) and how many more it has. Keyset on
    (nearest deadline, session id), in SQL: `after` names the last incident of the
    previous page. `incident` (a session id): that incident alone, INCIDENT_PAGE of its
    approvals. Three queries whatever the number of open approvals: the page's
    incidents (grouped, sorted and cut by PostgreSQL on approval_open_incident_idx),
    the open count, the page's approvals (a window keeps each incident's first ones).
    `roles` instead of `user`: the live consumer renders for a role set."""
    risk, scenario = clean_filters(risk, scenario)
    only = clean_incident(incident)
    approvals = open_approvals()
    if risk:
        approvals = approvals.filter(risk_class=risk)
    if scenario:
        approvals = approvals.filter(session__scenario__slug=scenario)
    if only is not None:
        approvals = approvals.filter(session_id=only)
    cursor = parse_incident_cursor(after) if only is None else None
    incident_page = list(open_incidents(approvals, cursor)[: QUEUE_PAGE + 1])
    more = len(incident_page) > QUEUE_PAGE
    incident_page = incident_page[:QUEUE_PAGE]
    open_count = approvals.count()
    per_incident = INCIDENT_PAGE if only is not None else INCIDENT_ITEMS
    order = {row["session_id"]: n for n, row in enumerate(incident_page)}
    waiting = {row["session_id"]: row["open"] for row in incident_page}
    page = (
        list(
            approvals.filter(session_id__in=list(order))
            # Each incident's riskiest first, then the nearest deadline: the ones shown.
            .annotate(
                place=Window(
                    RowNumber(),
                    partition_by=[F("session_id")],
                    order_by=[
                        F("risk_class").desc(),
                        F("deadline").asc(nulls_last=True),
                        F("id").asc(),
                    ],
                )
            )
            .filter(place__lte=per_incident)
            .select_related(
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
        group["open"] = waiting[group["session"].pk]
        group["more"] = group["open"] - len(group["items"])
    last = incident_page[-1] if incident_page else None
    return {
        "items": [item for group in groups for item in group["items"]],
        "groups": groups,
        "open_count": open_count,
        "after": after if cursor is not None else "",
        "next_after": incident_cursor(last["nearest"], last["session_id"]) if more and last else "",
        "incident": str(only) if only is not None else "",
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
