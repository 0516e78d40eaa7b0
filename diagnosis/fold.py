"""The state of a session computed from its events alone.

`fold_events(events)` is a pure function: no database, no LLM, no tool, no table but the
events passed in (model instances or anything with the same attributes). It gives the
session as it was at the last event passed, so replay steps through `events[:seq]` and
the export renders the full fold. The tables (`Session.snapshot`, `ToolCall`,
`Approval`, `Report`, the token counters) are projections of the same events kept for
speed; a test rebuilds every session from its events and compares.

Each event type's step is declared with the type (diagnosis.eventlog.registry).
`reduce_snapshot` is the one place the snapshot is derived: `append_event` applies it
when it writes an event, and the fold applies it when it reads one, so the live snapshot
and the replayed one cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable

from diagnosis.eventlog.registry import reduce_snapshot
from diagnosis.eventlog.state import (
    ApprovalState,
    Decision,
    EventLike,
    FoldState,
    Message,
    OutboxState,
    Question,
    ReportState,
    RestrictionState,
    ToolCallState,
    apply_event,
    parse_ts,
)

__all__ = [
    "ApprovalState",
    "Decision",
    "EventLike",
    "FoldState",
    "Message",
    "OutboxState",
    "Question",
    "ReportState",
    "RestrictionState",
    "ToolCallState",
    "fold_events",
    "parse_ts",
    "reduce_snapshot",
]


def fold_events(events: Iterable[EventLike], state: FoldState | None = None) -> FoldState:
    """The session at the last event passed. Pass `state` to continue a fold."""
    state = state if state is not None else FoldState()
    for event in events:
        apply_event(state, event)
    return state
