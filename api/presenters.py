"""JSON shapes of sessions, events, runs and approvals, shared by the REST API and the
WebSocket stream so both say the same thing."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from aero.packs import UnknownDomain, pack_for
from approvals.models import Approval, ApprovalStatus
from diagnosis.agent_tree import RunNode
from diagnosis.eventlog import masking
from diagnosis.eventlog.names import APPROVAL_REQUIRED
from diagnosis.models import Event, Session


def viewer_roles(viewer: Any) -> frozenset[str]:
    return frozenset(getattr(viewer, "api_roles", frozenset()))


def masks(roles: frozenset[str]) -> bool:
    """Read-only viewers (auditors) get the masked view (diagnosis.eventlog.masking);
    operating roles see payloads in full, as on the live pages."""
    return masking.masks_roles(roles)


def viewer_mask(session_id: Any, viewer: Any) -> masking.SessionMask | None:
    """The one masking rule for this viewer of the session (None: sees everything)."""
    return masking.session_mask(session_id, viewer_roles(viewer))


def timestamp(moment: datetime) -> str:
    """A time as every JSON answer of the API writes it (Django's encoder: milliseconds,
    "Z"), so an event's `ts` reads the same on the stream and in REST."""
    return str(DjangoJSONEncoder().default(moment))


def visible_payload(event: Event, mask: masking.SessionMask | None) -> dict[str, Any]:
    """The payload as this viewer may see it: one place for the REST timeline and the
    WebSocket stream."""
    return mask.shown(event.type, event.payload)[0] if mask is not None else event.payload


def envelope(event: Event, mask: masking.SessionMask | None) -> dict[str, Any]:
    """The tech plan's envelope (§2.3): event_id, session_id, type, ts, seq, payload."""
    return {
        "event_id": str(event.event_id),
        "session_id": str(event.session_id),
        "type": event.type,
        "ts": timestamp(event.ts),
        "seq": event.seq,
        "payload": visible_payload(event, mask),
    }


def session_out(session: Session, mask: masking.SessionMask | None = None) -> dict[str, Any]:
    open_approvals = getattr(session, "open_approvals", None)
    if open_approvals is None:
        open_approvals = session.approvals.open().count()
    fields = pack_report_fields(session)
    return {
        "id": session.pk,
        "title": session.title,
        "status": session.status,
        "problem_type": session.scenario.slug,
        "scenario_version": session.scenario_version.number,
        "language": session.language,
        "created_by": session.created_by.get_username(),
        "created_at": session.created_at,
        "started_at": session.started_at,
        "ended_at": session.ended_at,
        "last_seq": session.last_seq,
        "snapshot": mask.scrub(session.snapshot) if mask is not None else session.snapshot,
        "tokens_in": session.tokens_in,
        "tokens_out": session.tokens_out,
        "tokens_estimated": bool(session.snapshot.get("usage_estimated")),
        "cost": str(session.cost),
        "open_approvals": open_approvals,
        "has_report": hasattr(session, "report"),
        "report": mask.scrub(fields) if mask is not None and fields else fields,
    }


def pack_report_fields(session: Session) -> dict[str, Any] | None:
    """The report fields of the session's pack, if it has them (an IT diagnosis's)."""
    try:
        pack = pack_for(session.scenario.kind)
    except UnknownDomain:
        return None
    return pack.report_fields(session) if pack.report_fields else None


def run_out(node: RunNode) -> dict[str, Any]:
    """A run of the agent tree and the runs below it, as the API writes them."""
    return {
        "id": node.id,
        "parent": node.parent,
        "agent_name": node.agent_name,
        "mode": node.mode,
        "status": node.status,
        "started_at": node.started_at,
        "ended_at": node.ended_at,
        "elapsed_seconds": node.elapsed_seconds,
        "tokens_in": node.tokens_in,
        "tokens_out": node.tokens_out,
        "current_tool": node.current_tool,
        "output_summary": node.output_summary,
        "text": node.text,
        "writing": node.writing,
        "children": [run_out(child) for child in node.children],
    }


def approval_out(approval: Approval, roles: frozenset[str] | None = None) -> dict[str, Any]:
    mask = masking.session_mask(approval.session_id, roles) if roles is not None else None
    if approval.status == ApprovalStatus.PENDING:
        next_step = "approve"
    elif approval.status == ApprovalStatus.CONFIRMING:
        next_step = "confirm"
    else:
        next_step = "none"
    return {
        "id": approval.pk,
        "session_id": approval.session_id,
        "tool_call_id": approval.tool_call_id,
        "action": approval.action_name,
        "args": _args(approval, roles),
        "risk_class": approval.risk_class,
        "status": approval.status,
        "digest": approval.digest,
        "next_step": next_step,
        "created_at": approval.created_at,
        "deadline": approval.deadline,
        "first_approved_by": (
            approval.first_approved_by.get_username() if approval.first_approved_by else None
        ),
        "approver": approval.approver.get_username() if approval.approver else None,
        "reason": mask.text(approval.reason) if mask is not None else approval.reason,
        "edited": _edited(approval, roles, mask),
    }


def _edited(
    approval: Approval, roles: frozenset[str] | None, mask: masking.SessionMask | None
) -> dict[str, Any] | None:
    """The latest change of the arguments by an approver, or None."""
    if approval.edited_at is None:
        return None
    return {
        "by": approval.edited_by.get_username() if approval.edited_by else None,
        "at": approval.edited_at,
        "args_before": _args(approval, roles, approval.args_before_edit),
        "reason": mask.text(approval.edit_reason) if mask is not None else approval.edit_reason,
    }


def _args(approval: Approval, roles: frozenset[str] | None, args: Any = None) -> Any:
    """The action's arguments (or `args`, earlier ones of it), masked for the viewers
    the replay mask policy hides them from."""
    args = approval.tool_call.request_payload if args is None else args
    if roles is None or not masks(roles):
        return args
    masked, _ = masking.mask_payload(
        APPROVAL_REQUIRED, {"risk_level": approval.risk_class, "args": args}
    )
    return masked["args"]
