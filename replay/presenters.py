"""Replay: the session's state at any seq, from a pure fold over its events, and the
navigation around that seq (keyset on (session, seq); filters choose which steps the
player visits, never what the fold sees)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Max, Min, Q, QuerySet

from aero.shared_caches import shared_cache
from diagnosis.agent_tree import AgentTree
from diagnosis.eventlog import masking, names
from diagnosis.eventlog.masking import SessionMask
from diagnosis.fold import ApprovalState, FoldState, ToolCallState, fold_events
from diagnosis.models import AgentRun, Event, Session
from diagnosis.presenters import PageWorld, read_world
from diagnosis.reporting import display_value, report_text
from diagnosis.templatetags.timeline import scenario_language
from replay.forms import EVENT_GROUPS

# A step folds at most this many events after a cached state. A fold state is a few KB
# (a 50,000-event session: 500 checkpoints, ~2-10 KB each); loading 1,000 events per step
# cost ten times what 100 do.
CHECKPOINT_EVERY = 100
# Checkpoints are derived and rebuilt on demand, so they need not outlive interest in
# the session (a shared Redis must not fill with every session ever replayed).
CHECKPOINT_TTL = 7 * 24 * 3600
LIST_BEFORE = 10  # events listed before the current step (rendering dominates a step)
LIST_AFTER = 20  # ... and from it on
_CHECKPOINT_VERSION = 2  # bump when FoldState changes shape


@dataclass
class Filters:
    groups: list[str] = field(default_factory=list)
    run_ids: list[int] | None = None  # the selected run and its descendants
    since: datetime | None = None
    until: datetime | None = None

    @property
    def active(self) -> bool:
        return bool(self.groups or self.run_ids is not None or self.since or self.until)


def run_subtree(tree: AgentTree, session: Session, run_id: int) -> list[int]:
    """The run and every run below it: from the tree in hand, or (a tree cut at its
    limit may lack some of them) one query per level of the runs."""
    if not tree.truncated:
        return tree.subtree(run_id)
    ids = list(AgentRun.objects.filter(session=session, pk=run_id).values_list("pk", flat=True))
    level = ids
    while level:
        level = list(
            AgentRun.objects.filter(session=session, parent_id__in=level).values_list(
                "pk", flat=True
            )
        )
        ids.extend(level)
    return ids


def filtered(session: Session, filters: Filters) -> QuerySet[Event]:
    events = Event.objects.filter(session=session)
    if filters.groups:
        condition = Q()
        for group in filters.groups:
            for prefix in EVENT_GROUPS[group][1]:
                condition |= Q(type__startswith=prefix)
        events = events.filter(condition)
    if filters.run_ids is not None:
        events = events.filter(run_id__in=filters.run_ids)
    if filters.since:
        events = events.filter(ts__gte=filters.since)
    if filters.until:
        events = events.filter(ts__lte=filters.until)
    return events


def session_types(session: Session) -> list[str]:
    """The event types present in the session up to its last seq (a short list), read
    from the (session, type, seq) index once per log length."""
    key = f"replay:types:{session.pk.hex}:{session.last_seq}"
    types: list[str] | None = shared_cache("replay").get(key)
    if types is None:
        # order_by("type") replaces Event's default ordering, which DISTINCT would include.
        types = list(
            Event.objects.filter(session=session)
            .order_by("type")
            .values_list("type", flat=True)
            .distinct()
        )
        shared_cache("replay").set(key, types, timeout=CHECKPOINT_TTL)
    return types


def _group_types(session: Session, filters: Filters) -> list[str] | None:
    """The session's event types the group filter selects, or None without one."""
    if not filters.groups:
        return None
    prefixes = tuple(p for g in filters.groups for p in EVENT_GROUPS[g][1])
    return [t for t in session_types(session) if t.startswith(prefixes)]


def ordered(
    session: Session, filters: Filters, events: QuerySet[Event], order: str, limit: int
) -> QuerySet[Event]:
    """The first `limit` of `events` in `order` ("seq" or "-seq").

    A sparse group (approvals: 13 of 50,000 events) is the slow case for one walk of the
    (session, seq) index: a step far from any approval reads every event up to the start.
    So with a group filter each of its types walks the (session, type, seq) index
    (migration 0003) for at most `limit` rows, and the union keeps the first `limit`:
    O(types x limit) whatever the density. SQLite cannot order and slice inside a UNION;
    embedded logs are small, so it keeps the single walk."""
    types = _group_types(session, filters)
    if types is None or not connection.features.supports_slicing_ordering_in_compound:
        return events.order_by(order)[:limit]
    if not types:
        return events.none()
    parts = [events.filter(type=t).order_by(order)[:limit] for t in types]
    if len(parts) == 1:
        return parts[0]
    return parts[0].union(*parts[1:], all=True).order_by(order)[:limit]


def _seq(session: Session, filters: Filters, events: QuerySet[Event], order: str) -> int | None:
    return next(
        iter(ordered(session, filters, events, order, 1).values_list("seq", flat=True)), None
    )


def navigation(session: Session, filters: Filters, seq: int) -> dict[str, int | None]:
    """first / previous / next / last among the steps the filters select."""
    events = filtered(session, filters)
    if filters.active:
        # Walk an index from each end until a step matches; an aggregate would read every
        # matching event of a long log.
        first = _seq(session, filters, events, "seq")
        last = _seq(session, filters, events, "-seq")
    else:
        ends = events.aggregate(first=Min("seq"), last=Max("seq"))
        first, last = ends["first"], ends["last"]
    return {
        "first": first,
        "previous": _seq(session, filters, events.filter(seq__lt=seq), "-seq"),
        "next": _seq(session, filters, events.filter(seq__gt=seq), "seq"),
        "last": last,
    }


def seq_at_time(session: Session, filters: Filters, at: datetime) -> int | None:
    """The last selected step at or before a moment (the first one if none is)."""
    events = filtered(session, filters)
    return _seq(session, filters, events.filter(ts__lte=at), "-seq") or _seq(
        session, filters, events, "seq"
    )


def event_window(
    session: Session, filters: Filters, seq: int, after: int | None, before: int | None
) -> tuple[list[Event], int | None, int | None]:
    """A keyset page of the event list: around the current step, or after/before a seq.
    Returns (events, earlier_cursor, later_cursor)."""
    events = filtered(session, filters)
    size = LIST_BEFORE + LIST_AFTER

    def page(query: QuerySet[Event], order: str, limit: int) -> list[Event]:
        return list(ordered(session, filters, query, order, limit))

    if after is not None:
        rows = page(events.filter(seq__gt=after), "seq", size + 1)
        more_later = len(rows) > size
        rows = rows[:size]
        more_earlier = (
            after > 0 and _seq(session, filters, events.filter(seq__lte=after), "-seq") is not None
        )
    elif before is not None:
        rows = page(events.filter(seq__lt=before), "-seq", size + 1)
        more_earlier = len(rows) > size
        rows = list(reversed(rows[:size]))
        more_later = True
    else:
        earlier = page(events.filter(seq__lt=seq), "-seq", LIST_BEFORE + 1)
        later = page(events.filter(seq__gte=seq), "seq", LIST_AFTER + 1)
        more_earlier, more_later = len(earlier) > LIST_BEFORE, len(later) > LIST_AFTER
        rows = list(reversed(earlier[:LIST_BEFORE])) + later[:LIST_AFTER]
    if not rows:
        return [], None, None
    return rows, (rows[0].seq if more_earlier else None), (rows[-1].seq if more_later else None)


# --- the fold, with checkpoints ---------------------------------------------------------


def _checkpoint_key(session: Session, seq: int) -> str:
    return f"replay:fold:{_CHECKPOINT_VERSION}:{session.pk.hex}:{seq}"


def state_at(session: Session, seq: int) -> FoldState:
    """fold(events[:seq]). Events never change (append-only, hash-chained), so the state at
    every CHECKPOINT_EVERY-th seq is cached and a step folds at most that many events.
    A checkpoint is only ever the fold's own output: dropping them all changes no page."""
    cache = shared_cache("replay")
    marks = list(range(seq - seq % CHECKPOINT_EVERY, 0, -CHECKPOINT_EVERY))
    start, state = 0, None
    # The nearest checkpoint is there but on a first visit: one read, and only then more.
    nearest = cache.get(_checkpoint_key(session, marks[0])) if marks else None
    if nearest is not None:
        start, state = marks[0], nearest
    elif len(marks) > 1:
        found = cache.get_many([_checkpoint_key(session, m) for m in marks[1:]])
        for mark in marks[1:]:
            cached = found.get(_checkpoint_key(session, mark))
            if cached is not None:
                start, state = mark, cached
                break
    events = Event.objects.filter(session=session, seq__gt=start, seq__lte=seq).order_by("seq")
    pending: list[Event] = []
    new_marks: dict[str, FoldState] = {}
    # A step after a checkpoint reads at most CHECKPOINT_EVERY rows: one plain query. Only
    # a first visit far into the log streams (a server-side cursor costs extra round trips).
    rows = events.iterator(chunk_size=2000) if seq - start > CHECKPOINT_EVERY else list(events)
    for event in rows:
        pending.append(event)
        if event.seq % CHECKPOINT_EVERY == 0:
            state = fold_events(pending, state)
            pending = []
            # Pickled now: the fold goes on mutating the same state object.
            new_marks[_checkpoint_key(session, event.seq)] = copy.deepcopy(state)
            if len(new_marks) >= 50:  # one round trip per 50 checkpoints
                cache.set_many(new_marks, timeout=CHECKPOINT_TTL)
                new_marks = {}
    if new_marks:
        cache.set_many(new_marks, timeout=CHECKPOINT_TTL)
    return fold_events(pending, state)


# --- what the page shows ---------------------------------------------------------------


def field_rows(session: Session, state: FoldState) -> list[dict[str, Any]]:
    definition = session.scenario_version.definition
    # The reader's language picks the scenario's texts, as on the live page (an English
    # auditor of a Chinese session read "航班号" beside English headings).
    language = scenario_language()
    rows = []
    for name in definition["field_order"]:
        spec = definition["fields"][name]
        value = state.fields.get(name)
        rows.append(
            {
                "name": name,
                "label": spec["label"].get(language, name),
                "priority": spec["priority"],
                "known": value is not None,
                "display": display_value(spec, value, language),
                "evidence": state.evidence.get(name, ""),
            }
        )
    return rows


def call_row(
    call: ToolCallState, approval: ApprovalState | None, mask: SessionMask | None
) -> dict[str, Any]:
    """A tool call (and its approval) as the page and the export show it, masked for a
    viewer with a `mask`."""
    decisions = approval.decisions if approval else []
    row: dict[str, Any] = {
        "call_id": call.call_id,
        "tool_name": call.tool_name,
        "args": call.args,
        "risk_class": call.risk_class,
        "status": call.status,
        "result": call.response or None,
        "error": call.error,
        "completed_at": call.completed_at,
        "duration_ms": call.duration_ms,
        "approval": approval,
        "decisions": decisions,
        "masked": False,
    }
    if mask is None:
        return row
    row["decisions"] = [replace(d, reason=mask.text(d.reason)) for d in decisions]
    row = masking.mask_call(row, names.TOOL_CALL_COMPLETED)
    if row["masked"]:
        row["call_id"] = masking.MASKED
        return row
    # A call the rule does not mask may still name what a masked one hides (a lookup's
    # result names the taxiway the closure closes).
    for key in ("call_id", "args", "result", "error"):
        row[key] = mask.scrub(row[key])
    return row


def shown_state(state: FoldState, mask: SessionMask | None) -> FoldState:
    """The state as a viewer with `mask` may see what its analyses found (risk, impact,
    lookups: the snapshot)."""
    if mask is None:
        return state
    return replace(state, snapshot=mask.snapshot(state.snapshot))


def action_rows(state: FoldState, mask: SessionMask | None) -> list[dict[str, Any]]:
    """The response actions in proposal order, each with its decisions."""
    return [call_row(c, state.approvals.get(c.call_id), mask) for c in state.actions]


def evidence_calls(state: FoldState, mask: SessionMask | None) -> list[dict[str, Any]]:
    """Every tool call, lookups and actions, in the order they were first logged."""
    return [call_row(c, state.approvals.get(c.call_id), mask) for c in state.tool_calls.values()]


def question_rows(state: FoldState) -> list[dict[str, Any]]:
    return [
        {"question": q, "answers": [m for m in state.messages if m.answers == q.key]}
        for q in state.questions
    ]


def in_force_at(state: FoldState) -> list[Any]:
    """The restrictions this session imposed and had not lifted by then (each with its
    kind and target, for the map only)."""
    return [r for r in state.restrictions if r.lifted_seq is None]


def shown_payload(event: Event, mask: SessionMask | None) -> tuple[dict[str, Any], list[str]]:
    """The payload as the viewer may see it and the keys masked in it."""
    if mask is None:
        return event.payload, []
    return mask.shown(event.type, event.payload)


def report_markdown(state: FoldState, mask: SessionMask | None, session: Session) -> str:
    """The report as the fold holds it, in the reader's language (worded from its facts;
    as written when it was logged without them), its hidden values masked for a masked
    viewer."""
    if state.report is None:
        return ""
    text = report_text(session, state.report.markdown, state.report.facts)
    return mask.text(text) if mask is not None else text


def page_world() -> PageWorld | None:
    """The world, kept per process by its pack while its stamp is unchanged: a replay
    step costs one query for it (the session's own restrictions replace those in force
    now). None where no world is installed."""
    return read_world(in_force=[])


def impact_map_at(world: PageWorld | None, state: FoldState) -> dict[str, Any]:
    """The map as it stood at the step: the session's impact and its own restrictions.
    (The world is today's: its edits are not in the session's log.)"""
    if world is None:
        return {}
    return world.map(state.impact, in_force_at(state))
