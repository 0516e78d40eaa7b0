from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.models import Count, F, Func, IntegerField, Min, Q, QuerySet
from django.utils.safestring import mark_safe

from aero.compiled import Compiled
from aero.packs import UnknownDomain, pack_for, stamped_pack
from aero.roles import DECIDE_APPROVALS, user_roles
from approvals import cards
from approvals.models import Approval, ManualTodo
from diagnosis.models import Session
from diagnosis.presenters import read_world
from diagnosis.restrictions import in_force as restrictions_in_force
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


class _OpenTotal(Func):
    """The open approvals of every incident the grouped query keeps, before its LIMIT:
    the page's count comes with its incidents (one scan of the index, not two)."""

    template = "SUM(COUNT(*)) OVER ()"
    window_compatible = True
    contains_over_clause = True

    def __init__(self) -> None:
        super().__init__(output_field=IntegerField())

    def get_group_by_cols(self) -> list[Any]:
        return []


def open_incidents(
    approvals: QuerySet[Approval], cursor: IncidentKey | None, *, total: bool = False
) -> QuerySet[Any]:
    """One row per incident of `approvals` (session_id, nearest deadline, open count) in
    queue order, after `cursor`: grouped, sorted and cut in SQL. `total`: each row also
    carries the open count of all the incidents kept (the first page's count)."""
    incidents = (
        approvals.order_by()
        .values("session_id")
        .annotate(nearest=Min("deadline"), open=Count("*"))
        .order_by(F("nearest").asc(nulls_last=True), "session_id")
    )
    if total:
        incidents = incidents.annotate(total=_OpenTotal())
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
    csrf_token: str = "",
    error: str = "",
    error_for: int | None = None,
    marks: bool = False,
) -> dict[str, Any]:
    """One page of open approvals across sessions, paged by incident: the QUEUE_PAGE
    incidents whose nearest deadline comes first, each with its first INCIDENT_ITEMS
    open approvals (that match the filters) and how many more it has. Keyset on
    (nearest deadline, session id), in SQL: `after` names the last incident of the
    previous page. `incident` (a session id): that incident alone, INCIDENT_PAGE of its
    approvals. Whatever the number of open approvals: the page's incidents with the
    open count (grouped, sorted and cut by PostgreSQL on approval_open_incident_idx),
    the page's approvals (a window keeps each incident's first ones), their sessions,
    the board's stamp; each incident's card comes rendered from the shared cache when
    nothing it shows changed (approvals.cards). `roles` instead of `user`: the live
    consumer renders for a role set. `csrf_token`: the viewer's, for the cards' forms.
    `error` on the card of approval `error_for` (that card is rendered for this
    request alone). `marks`: the cards keep their marks (CSRF token, deadlines) for
    the page cache to fill in (approvals.page_cache)."""
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
    incident_page = list(open_incidents(approvals, cursor, total=cursor is None)[: QUEUE_PAGE + 1])
    more = len(incident_page) > QUEUE_PAGE
    incident_page = incident_page[:QUEUE_PAGE]
    if cursor is None:
        open_count = int(incident_page[0]["total"]) if incident_page else 0
    else:
        open_count = approvals.count()
    viewer_roles = roles if roles is not None else user_roles(user)
    context: dict[str, Any] = {
        "risk": risk,
        "scenario": scenario,
        "incident": str(only) if only is not None else "",
        "can_decide": bool(viewer_roles & set(DECIDE_APPROVALS)),
        "two_person_rule": settings.AERO_TWO_PERSON_RULE,
        "queue_error": error,
        "error_for": error_for,
    }
    per_incident = INCIDENT_PAGE if only is not None else INCIDENT_ITEMS
    groups = (
        _cards(incident_page, per_incident, context, csrf_token, marks) if incident_page else []
    )
    last = incident_page[-1] if incident_page else None
    return {
        **context,
        "groups": groups,
        "shown": [pk for group in groups for pk in group["shown"]],
        "open_count": open_count,
        "after": after if cursor is not None else "",
        "next_after": incident_cursor(last["nearest"], last["session_id"]) if more and last else "",
        "risk_classes": RISK_CLASSES,
        "scenarios": Scenario.objects.filter(is_active=True),
    }


def _cards(
    incident_page: list[dict[str, Any]],
    per_incident: int,
    context: dict[str, Any],
    csrf_token: str,
    marks: bool = False,
) -> list[dict[str, Any]]:
    """The page's incidents in queue order, each with its card (group["html"]) as this
    request shows it and the approvals it lists (group["shown"]). A card comes from the
    shared cache when nothing it shows changed; else it is rendered and kept. Its actions
    are the incident's first `per_incident` open ones, riskiest first, then the nearest
    deadline (the order of the window that keeps them, in SQL)."""
    ids = [row["session_id"] for row in incident_page]
    # The incidents come from open_approvals(): sessions not deleted, of the scenario
    # filtered; only the risk filter applies again.
    rows: dict[Any, list[tuple[Any, ...]]] = {pk: [] for pk in ids}
    for row in cards.page_rows(ids, per_incident, context["risk"]):
        rows[row[cards.SESSION_AT]].append(row)
    topology = _world_stamp()
    restrictions = restrictions_in_force()
    shared = cards.shared_facts(
        risk=context["risk"],
        scenario=context["scenario"],
        incident=context["incident"],
        can_decide=context["can_decide"],
        board=cards.board_stamp(topology, restrictions),
    )
    groups = [
        {
            "session_id": row["session_id"],
            "open": row["open"],
            "shown": [approval[0] for approval in rows[row["session_id"]]],
            "key": cards.card_key(row["open"], rows[row["session_id"]], shared),
        }
        for row in incident_page
        # Decided since the incidents were read: nothing of it to show.
        if rows[row["session_id"]]
    ]
    found = cards.cached_cards(group["key"] for group in groups)
    error_for = context["error_for"] if context["queue_error"] else None
    fresh: dict[str, str] = {}
    missing = []
    for group in groups:
        # The card showing an error is this request's alone: rendered, never kept.
        with_error = error_for is not None and error_for in group["shown"]
        card = None if with_error else found.get(group["key"])
        if card is None:
            missing.append(group)
            group["keep"] = not with_error
        else:
            group["card"] = card
    if missing:
        _render(missing, per_incident, context, topology, restrictions, shared)
        fresh = {g["key"]: g["card"] for g in missing if g["keep"]}
        cards.keep_cards(fresh)
    for group in groups:
        # The card's text came from the template engine (escaped), marks and all.
        group["html"] = (
            mark_safe(group["card"]) if marks else cards.finish(group["card"], csrf_token)
        )
    return groups


def _world_stamp() -> tuple[Any, Any] | None:
    """The stamp of the world the cards' maps and consequences are drawn on (the active
    row of its pack's model), or None without one."""
    pack = stamped_pack()
    if pack is None or pack.world_stamp is None:
        return None
    model = pack.world_stamp
    read = _stamps.get(model)
    if read is None:
        read = _stamps.setdefault(
            model,
            Compiled(
                model,
                lambda: (
                    model.objects.filter(is_active=True)
                    .order_by("pk")
                    .values_list("pk", "updated_at")[:1]
                ),
            ),
        )
    stamp = read.first()
    return tuple(stamp) if stamp is not None else None


# Read by every queue page: compiled once per connection (per world model).
_stamps: dict[Any, Compiled[Any]] = {}


def _render(
    groups: list[dict[str, Any]],
    per_incident: int,
    context: dict[str, Any],
    topology: tuple[Any, Any] | None,
    restrictions: list[Any],
    shared: tuple[Any, ...],
) -> None:
    """Render the cards of `groups` from their rows read whole (group["card"]), keyed by
    what they were rendered from (group["key"]): a change since the key was read makes
    a newer card, never a staler one."""
    ids = [g["session_id"] for g in groups]
    items: dict[Any, list[dict[str, Any]]] = {pk: [] for pk in ids}
    for approval in cards.page_approvals(ids, per_incident, context["risk"]):
        items[approval.session_id].append({"a": approval, "session": approval.session})
    world = read_world(topology, restrictions) if topology is not None else None
    board = world.board() if world is not None else None
    for group in groups:
        found = items[group["session_id"]]
        if not found:
            # Decided since its facts were read: the card says nothing waits, not kept.
            group.update(card="", keep=False, shown=[])
            continue
        session = found[0]["session"]
        for item in found:
            item["a"].session = item["session"] = session
        group.update(
            session=session,
            card_template=_card_template(session.scenario.kind),
            risk=session.snapshot.get("risk"),
            impact=session.snapshot.get("impact"),
            items=found,
            shown=[item["a"].pk for item in found],
        )
        group["more"] = group["open"] - len(group["items"])
        group["r1_open"] = [
            i["a"]
            for i in group["items"]
            if i["a"].risk_class == "R1"
            # money and lifts are decided one by one
            and not (i["a"].is_lift or i["a"].is_budget)
        ]
        # The map itself is loaded when its folded panel opens (incident_map).
        group["has_map"] = world is not None
        for item in group["items"]:
            call = item["a"].tool_call
            item["consequence"] = (
                board.consequence(call.tool_name, call.request_payload, session.pk)
                if board
                else None
            )
        group["key"] = cards.card_key(
            group["open"], [cards.facts_of(item["a"]) for item in found], shared
        )
        group["card"] = cards.render_card(group, context)


def _card_template(kind: str) -> str | None:
    """What the session's pack draws of its findings on the card (none for a kind no
    installed pack serves)."""
    try:
        return pack_for(kind).card_template
    except UnknownDomain:
        return None


def incident_map(session: Session) -> dict[str, Any] | None:
    """What a card's folded impact map shows (approvals:incident-map): the map of the
    session's impact on the world as it is now, None without a world."""
    world = read_world(_world_stamp(), restrictions_in_force())
    if world is None:
        return None
    impact = session.snapshot.get("impact")
    return {"map": world.map(impact), "impact": impact}


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
    in_force_now = {(r.kind, r.target): r for r in restrictions_in_force()}
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
