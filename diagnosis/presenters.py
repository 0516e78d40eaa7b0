"""What the session pages and the live consumer show: one place builds the context, so a
pushed fragment and a full page render the same thing for the same viewer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from django.conf import settings
from django.db.models import Q

from aero.packs import installed_packs, pack_for
from aero.roles import DECIDE_APPROVALS, DELETE_SESSIONS, RUN_SESSIONS, user_roles
from diagnosis import page_reads
from diagnosis.agent_tree import TreeOnce
from diagnosis.consequences import Board
from diagnosis.eventlog import registry
from diagnosis.eventlog.masking import SessionMask, session_mask
from diagnosis.models import (
    WITHDRAWN_ASKED_AGAIN,
    WITHDRAWN_NOT_CALLED_FOR,
    WITHDRAWN_NOT_CALLED_FOR_ANSWER,
    WITHDRAWN_SUPERSEDED,
    Event,
    Session,
    ToolCall,
    ToolCallStatus,
)
from diagnosis.reporting import decision_of, display_value, markdown_to_html, report_text
from diagnosis.restrictions import in_force as restrictions_in_force
from diagnosis.templatetags.timeline import scenario_language
from scenarios_admin.models import ScenarioVersion

TIMELINE_PAGE = 200  # rendering dominates the page's time, and grows with the rows
# The session page shows the newest rows only, whatever the log's length: its rows cost
# most of its render; older ones load a page at a time ("Earlier events").
SESSION_PAGE_EVENTS = 50
SESSION_PAGE = 100


# The agent tree's panel: any event a run wrote changes it (its status, tool, time or
# tokens), whatever its type; a status change starts or ends a job's run.
AGENTS_PANEL = "session-agents"


def panels_of(event: Event) -> frozenset[str]:
    """Which panels an event changes (the consumer re-renders only those), as its type
    declares, and the agent tree when a run wrote it. The composer is not among them:
    the consumer re-sends it whenever its composer_key changes."""
    declared = registry.panels(event.type)
    return declared | {AGENTS_PANEL} if event.run_id is not None else declared


def composer_key(session: Session) -> str:
    """What the answer box shows: it changes with the question and the broad state."""
    question = session.snapshot.get("question") or {}
    if session.is_ended:
        state = "ended"
    elif question:
        state = "asking"
    elif session.status == "waiting_user":
        state = "approvals"
    else:
        state = "working"
    return f"{state}:{question.get('key', '')}"


def flags_for_roles(roles: frozenset[str]) -> dict[str, bool]:
    """What a viewer may do on the page follows from their roles alone (never from who
    they are), so every viewer with the same roles can be sent the same fragment."""
    return {
        "can_run": bool(roles & set(RUN_SESSIONS)),
        "can_decide": bool(roles & set(DECIDE_APPROVALS)),
        "can_delete": bool(roles & set(DELETE_SESSIONS)),
    }


def viewer_flags(user: Any) -> dict[str, bool]:
    return flags_for_roles(user_roles(user))


# Published versions never change (ScenarioVersion.save refuses), so each process reads
# and parses a definition once; a publish makes a new version, hence a new key.
_definitions: dict[tuple[int, str], dict[str, Any]] = {}


def version_definition(session: Session) -> dict[str, Any]:
    """The session's scenario definition. Callers may defer the (large) definition
    column when they select the version; it is then loaded once per process."""
    version = session.scenario_version
    key = (version.pk, version.checksum)
    found = _definitions.get(key)
    if found is None:
        if "definition" in version.get_deferred_fields():
            found = ScenarioVersion.objects.values_list("definition", flat=True).get(pk=version.pk)
        else:
            found = version.definition
        _definitions[key] = found
    return found


def field_rows(session: Session) -> list[dict[str, Any]]:
    definition = version_definition(session)
    fields = session.snapshot.get("fields", {})
    evidence = session.snapshot.get("evidence", {})
    # The page's language picks the scenario's texts (scenarios carry zh and en).
    language = scenario_language()
    rows = []
    for name in definition["field_order"]:
        spec = definition["fields"][name]
        rows.append(
            {
                "name": name,
                "label": spec["label"].get(language, name),
                "priority": spec["priority"],
                "known": fields.get(name) is not None,
                "display": display_value(spec, fields.get(name), language),
                "evidence": evidence.get(name, ""),
                "type": spec["type"],
                # What a correction may choose (enum values, yes/no); None: typed in.
                "choices": correction_choices(spec, language),
                "raw": fields.get(name),
            }
        )
    return rows


def correction_choices(spec: dict[str, Any], language: str) -> list[tuple[str, str]] | None:
    if spec["type"] == "bool":
        return [
            ("true", display_value(spec, True, language)),
            ("false", display_value(spec, False, language)),
        ]
    if spec["type"] == "enum":
        return [(key, display_value(spec, key, language)) for key in (spec.get("values") or {})]
    return None


def action_rows(
    session: Session,
    board: Board | None = None,
    reads: SessionReads | None = None,
    mask: SessionMask | None = None,
) -> list[dict[str, Any]]:
    """The session's actions; with `board`, each open one with its plain words and its
    consequence on the world as it is now (diagnosis.consequences). `reads`: the calls
    and approvals already read (read_session). `mask`: the viewer's (masking): a masked
    call shows no consequence, which would name what its arguments hide."""
    reads = reads or read_session(session)
    approvals = {a.tool_call_id: a for a in reads.approvals}
    rows = []
    for c in reads.calls:
        approval = approvals.get(c.pk)
        hidden = mask is not None and mask.call(c)
        rows.append(
            {
                "call": mask.tool_call(c) if mask is not None else c,
                "decision": decision_of(c),
                "withdrawn": _withdrawn(c),
                "approval": mask.approval(approval)
                if mask is not None and approval is not None
                else approval,
                "consequence": board.consequence(c.tool_name, c.request_payload, session.pk)
                if board and not hidden
                else None,
            }
        )
    return rows


def viewer_mask(
    session: Session, user: Any = None, roles: frozenset[str] | None = None
) -> SessionMask | None:
    """The masking for this viewer of the session (by `roles` when given, else the user's
    roles); None for a viewer who sees everything."""
    return session_mask(session, roles if roles is not None else user_roles(user))


def _withdrawn(call: ToolCall) -> str:
    """How a call withdrawn after a correction or an answer was withdrawn ("asked_again",
    "not_called_for", "superseded", "not_called_for_answer"; "" for any other call):
    canceled, but not with the session."""
    if call.status != ToolCallStatus.CANCELED:
        return ""
    return {
        WITHDRAWN_ASKED_AGAIN: "asked_again",
        WITHDRAWN_NOT_CALLED_FOR: "not_called_for",
        WITHDRAWN_SUPERSEDED: "superseded",
        WITHDRAWN_NOT_CALLED_FOR_ANSWER: "not_called_for_answer",
    }.get(call.decision_reason, "")


@dataclass(frozen=True)
class SessionReads:
    """What the session panels read from the database, apart from how they word it: the
    live consumer reads it once per session and renders it for several languages and
    role sets. The world (PageWorld) is the same for every session and may be passed
    in, read once for many."""

    world: PageWorld | None
    # The last `report.ready` payload (its text as written and its facts), or None.
    report: dict[str, Any] | None
    calls: list[ToolCall]
    approvals: list[Any]
    # Read when the agent tree panel renders (it shows no summary: nothing to mask).
    agent_tree: TreeOnce


class PageWorld(Protocol):
    """What a pack's pages word every session with (its `page_world`): the world as it is
    now with the restrictions in force."""

    def board(self) -> Board:
        """What a proposed action would do to the world (diagnosis.consequences)."""
        ...

    def key(self) -> tuple[Any, ...]:
        """Everything board() and map() word with, as a value (the shared panels'
        keys name it: diagnosis.page_panels)."""
        ...

    def map(
        self, impact: dict[str, Any] | None, in_force: list[Any] | None = None
    ) -> dict[str, Any]:
        """The map of a session's impact (with `in_force`: those restrictions drawn
        instead of the ones in force now); its `template` draws it (the pack's own)."""
        ...


def read_world(
    stamp: tuple[Any, Any] | None = None, in_force: list[Any] | None = None
) -> PageWorld | None:
    """The world the panels word things with, as the installed pack that keeps one reads
    it (`stamp`: as a caller read its stamp; `in_force`: the restrictions in force, read
    here when not given); None where no world is installed (a deployment that only
    diagnoses IT problems): its sessions' pages name no place."""
    for pack in installed_packs():
        if pack.page_world is not None:
            if in_force is None:
                in_force = restrictions_in_force()
            try:
                world: PageWorld = pack.page_world(stamp, in_force)
            except LookupError:
                return None
            return world
    return None


def read_session(
    session: Session, world: PageWorld | None = None, *, world_read: bool = False
) -> SessionReads:
    """`world`, `world_read`: the world read once for many sessions (read_world; None
    read is no world); read here when not `world_read`."""
    if not world_read:
        world = read_world()
    # Compiled once per connection (page_reads): building these querysets cost the page
    # as much as running them.
    calls = page_reads.calls(session.pk)
    return SessionReads(
        world=world,
        report=page_reads.report(session.pk),
        calls=calls,
        approvals=page_reads.approvals(session.pk, calls),
        agent_tree=TreeOnce(session.pk),
    )


def session_context(
    session: Session,
    user: Any,
    *,
    roles: frozenset[str] | None = None,
    reads: SessionReads | None = None,
    mask: SessionMask | None = None,
) -> dict[str, Any]:
    """`roles` instead of `user`: the live consumer renders for a role set, not a person.
    `reads`: what read_session returned, for a caller rendering it more than once.
    `mask`: the viewer's masking when the caller has it already."""
    reads = reads or read_session(session)
    world, report = reads.world, reads.report
    mask = mask or viewer_mask(session, user, roles)
    # What the analyses found, as this viewer may see it (the map's nodes are the
    # world's own, read from the snapshot as it is).
    snapshot = mask.snapshot(session.snapshot) if mask is not None else session.snapshot
    # Worded in the viewer's language from the logged facts (the text as written for a
    # report logged before reports kept them).
    report_markdown = (
        report_text(
            session,
            str(report.get("markdown") or ""),
            report.get("facts"),
            definition=version_definition(session),
            calls=reads.calls,
        )
        if report
        else ""
    )
    if mask is not None:
        report_markdown = mask.text(report_markdown)
    definition = version_definition(session)
    pack = pack_for(definition["kind"])
    # The session's pack may show what it found in its own panel.
    pack_panel: dict[str, Any] = {}
    if pack.page_panel is not None and pack.page_context is not None:
        pack_panel = {"pack_panel": pack.page_panel, **pack.page_context(session, mask)}
    return {
        **pack_panel,
        "session": session,
        "definition": definition,
        "snapshot": snapshot,
        "fields": field_rows(session),
        "pack_facts": pack.facts_template,
        "question": snapshot.get("question"),
        "risk": snapshot.get("risk"),
        "impact": snapshot.get("impact"),
        "enrichment": snapshot.get("enrichment"),
        "fsm": snapshot.get("fsm", "INIT"),
        "map": world.map(session.snapshot.get("impact")) if world is not None else None,
        "actions": action_rows(session, world.board() if world else None, reads, mask),
        "report": report,
        "report_html": markdown_to_html(report_markdown) if report else "",
        # Closing with a summary cancels these too: the close form asks first.
        "open_approvals": sum(
            1 for approval in reads.approvals if approval.status in ("pending", "confirming")
        ),
        "two_person_rule": settings.AERO_TWO_PERSON_RULE,
        "composer_key": composer_key(session),
        # The model's text, streaming or final: the snapshot holds it, so no query.
        "thinking": snapshot.get("thinking"),
        "agent_tree": reads.agent_tree.for_mask(mask),
        # The timeline beside the panels is masked by the same mask (views, consumer).
        "viewer_mask": mask,
        **(flags_for_roles(roles) if roles is not None else viewer_flags(user)),
    }


def timeline(
    session: Session, *, after: int = 0, before: int | None = None, limit: int | None = None
) -> list[Event]:
    limit = limit or TIMELINE_PAGE
    events = Event.objects.filter(session=session, seq__gt=after)
    if before is not None:
        events = events.filter(seq__lt=before)
        return list(reversed(events.order_by("-seq")[:limit]))
    return list(events.order_by("seq")[:limit])


def latest_events(session: Session, limit: int | None = None) -> list[Event]:
    """The newest page of the timeline (older ones: the events page, keyset by seq), up
    to the seq of the `session` row in hand, as the live pull bounds its events: the
    panels were worded from that row, and the page's socket asks for what follows the
    last row it shows. A job committing between the two reads once put its events in
    the timeline of a page whose panels predate them; the socket then asked for nothing
    after them, and the facts stayed stale until a reload."""
    return page_reads.latest_events(session, limit or TIMELINE_PAGE)


def session_page(status: str = "", before: str = "") -> dict[str, Any]:
    """One page of the session list, newest first. Keyset pagination on (created_at,
    id): `before` is the id of the last session of the previous page, so page 500 costs
    what page 1 costs (an OFFSET would read every row before it)."""
    sessions = Session.objects.visible().select_related("scenario", "created_by")
    if status:
        sessions = sessions.filter(status=status)
    try:
        anchor_id: UUID | None = UUID(before) if before else None
    except ValueError:
        anchor_id = None
    anchor = (
        Session.objects.filter(pk=anchor_id).values_list("created_at", flat=True).first()
        if anchor_id
        else None
    )
    if anchor is not None:
        sessions = sessions.filter(
            Q(created_at__lt=anchor) | Q(created_at=anchor, pk__lt=anchor_id)
        )
    page = list(sessions.order_by("-created_at", "-pk")[: SESSION_PAGE + 1])
    more = len(page) > SESSION_PAGE
    page = page[:SESSION_PAGE]
    return {
        "sessions": page,
        "before": before if anchor is not None else "",
        "next_before": str(page[-1].pk) if more else "",
    }
