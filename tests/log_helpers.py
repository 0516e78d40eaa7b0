"""Rebuild a session from its events alone and compare it with the tables."""

from __future__ import annotations

from typing import Any

from approvals.models import Approval
from diagnosis.fold import FoldState, fold_events
from diagnosis.models import Event, Outbox, Report, Session, ToolCall
from packs.airport.models import Restriction


def fold_of(session: Session) -> FoldState:
    return fold_events(Event.objects.filter(session=session).order_by("seq"))


def _name(user: Any) -> str | None:
    return user.get_username() if user is not None else None


def assert_projections_match(session: Session) -> FoldState:
    """The fold of the session's events equals its snapshot, status, counters and its
    ToolCall, Approval and Report rows. Returns the fold for further checks."""
    session.refresh_from_db()
    state = fold_of(session)
    assert state.seq == session.last_seq
    assert state.events == session.last_seq  # gap-free
    assert state.status == session.status
    assert state.snapshot == session.snapshot
    assert (state.tokens_in, state.tokens_out) == (session.tokens_in, session.tokens_out)
    assert state.cost == session.cost
    assert state.failure == session.failure
    assert state.title == session.title and state.language == session.language

    table_calls = {
        c.call_id: c for c in ToolCall.objects.filter(session=session).select_related("decided_by")
    }
    assert set(state.tool_calls) == set(table_calls)
    for call_id, row in table_calls.items():
        folded = state.tool_calls[call_id]
        folded_row = (
            folded.tool_call,
            folded.tool_name,
            folded.args,
            folded.risk_class,
            folded.is_action,
            folded.position,
            folded.status,
            folded.response,
            folded.error,
            folded.attempts,
            folded.duration_ms,
            folded.completed_at,
            folded.decided_by,
            folded.decided_at,
            folded.decision_reason,
        )
        table_row = (
            row.pk,
            row.tool_name,
            row.request_payload,
            row.risk_class,
            row.is_action,
            row.position,
            row.status,
            row.response_payload,
            row.error,
            row.attempts,
            row.duration_ms,
            row.completed_at,
            _name(row.decided_by),
            row.decided_at,
            row.decision_reason,
        )
        assert folded_row == table_row, (call_id, folded_row, table_row)

    table_approvals = {
        a.tool_call.call_id: a
        for a in Approval.objects.filter(session=session).select_related(
            "tool_call", "first_approved_by", "approver", "edited_by"
        )
    }
    assert set(state.approvals) == set(table_approvals)
    for call_id, approval in table_approvals.items():
        folded_approval = state.approvals[call_id]
        todo = getattr(approval, "todo", None) if approval.status == "timeout" else None
        assert (
            folded_approval.tool_call,
            folded_approval.action_name,
            folded_approval.risk_class,
            folded_approval.status,
            folded_approval.digest,
            folded_approval.deadline,
            folded_approval.first_approved_by,
            folded_approval.first_approved_at,
            folded_approval.approver,
            folded_approval.reason,
            folded_approval.decided_at,
            folded_approval.todo,
            folded_approval.edited_by,
            folded_approval.edited_at,
            folded_approval.args_before_edit,
            folded_approval.edit_reason,
        ) == (
            approval.tool_call_id,
            approval.action_name,
            approval.risk_class,
            approval.status,
            approval.digest,
            approval.deadline,
            _name(approval.first_approved_by),
            approval.first_approved_at,
            _name(approval.approver),
            approval.reason,
            approval.decided_at,
            todo.pk if todo else None,
            _name(approval.edited_by),
            approval.edited_at,
            approval.args_before_edit,
            approval.edit_reason,
        ), call_id

    # The outbox rows too: each action's effect, its attempts and how it ended.
    table_outbox = {
        o.tool_call.call_id: (
            o.pk,
            o.idempotency_key,
            o.status,
            o.last_error,
            o.completed_at,
        )
        for o in Outbox.objects.filter(session=session).select_related("tool_call")
    }
    folded_outbox = {
        call_id: (
            o.outbox,
            o.idempotency_key,
            o.status,
            o.last_error,
            o.completed_at,
        )
        for call_id, o in state.outbox.items()
    }
    assert folded_outbox == table_outbox

    # The restrictions this session put in force (by an executed action, or by hand when
    # its timed-out to-do was done), and which of them were lifted.
    table_restrictions = sorted(
        (r.kind, r.target, r.tool_call.call_id, r.lifted_at is not None)
        for r in Restriction.objects.filter(session=session).select_related("tool_call")
    )
    folded_restrictions = sorted(
        (r.kind, r.target, r.call_id, r.lifted_seq is not None) for r in state.restrictions
    )
    assert folded_restrictions == table_restrictions

    report = Report.objects.filter(session=session).first()
    if report is None:
        assert state.report is None
    else:
        assert state.report is not None
        assert (state.report.markdown, state.report.language) == (report.markdown, report.language)
    return state
