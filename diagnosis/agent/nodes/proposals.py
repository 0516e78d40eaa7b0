"""Action proposals: opened, withdrawn after a correction, or not made when the closure
is already in force."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import cache
from typing import Any

from django.db import transaction
from django.utils import timezone

from aero.compiled import AnyOf, Arg, Compiled, insert_rows
from diagnosis import restrictions
from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import ToolContext, get_or_create_call, new_call, run_action
from diagnosis.eventlog.names import AGENT_NOTE, APPROVAL_ARGS_EDITED, APPROVAL_CANCELED
from diagnosis.events import append_event_once, as_logged, lock_session
from diagnosis.execution import log_approval_required, open_approval
from diagnosis.models import (
    WITHDRAWN_ASKED_AGAIN,
    WITHDRAWN_NOT_CALLED_FOR,
    WITHDRAWN_NOT_CALLED_FOR_ANSWER,
    WITHDRAWN_SUPERSEDED,
    AgentRun,
    Event,
    Session,
    ToolCall,
    ToolCallStatus,
)
from diagnosis.signals import approval_withdrawn, approvals_required
from scenarios_admin.definition import restriction_of

DONE_OR_UNDER_WAY = (
    ToolCallStatus.APPROVED,
    ToolCallStatus.EXECUTING,
    ToolCallStatus.RUNNING,
    ToolCallStatus.COMPLETED,
)


def base_call_id(call_id: str) -> str:
    return call_id.split("#r", 1)[0]


def revise_proposals(
    ctx: AgentContext,
    run: AgentRun,
    proposals: list[dict[str, Any]],
    revision: int,
    actions: list[ToolCall],
    *,
    answered: bool = False,
) -> list[dict[str, Any]]:
    """The proposals after a correction. Approvals still open were requested
    under the earlier facts (their state digest no longer holds): each is withdrawn with
    an `approval.canceled` event (`withdrawn`), saying whether the corrected facts still
    call for it (then it is asked again, as revision n: a new call id and approval) or not.
    An action already approved or done is proposed again only when the corrected facts
    change its arguments (ATC told "fuel, HIGH" hears "oil, MEDIUM"; the crew sent to
    stand 105 is sent to 107): the same arguments are never sent twice. Keyed, so a re-run
    step withdraws and proposes nothing twice. After an optional question's answer
    (`answered`) the open approvals are superseded: the reason names the answer."""
    wanted = {p["call_id"] for p in proposals}
    done = done_with_args(ctx.session_id, actions)
    for call in actions:
        if call.status != ToolCallStatus.AWAITING_APPROVAL:
            continue
        still = base_call_id(call.call_id) in wanted
        if answered:
            reason = WITHDRAWN_SUPERSEDED if still else WITHDRAWN_NOT_CALLED_FOR_ANSWER
            how = "superseded" if still else "not_called_for"
        else:
            reason = WITHDRAWN_ASKED_AGAIN if still else WITHDRAWN_NOT_CALLED_FOR
            how = "asked_again" if still else "not_called_for"
        at = timezone.now()
        with transaction.atomic(savepoint=False):  # inside the step
            lock_session(ctx.session_id)  # before the call and its approval: lock order
            ToolCall.objects.filter(pk=call.pk).update(
                status=ToolCallStatus.CANCELED, decided_at=at, decision_reason=reason
            )
            approval_withdrawn.send(sender=ToolCall, tool_call=call, reason=reason, at=at)
            append_event_once(
                ctx.session_id,
                APPROVAL_CANCELED,
                f"withdrawn:{call.pk}",
                {
                    "tool_call": call.pk,
                    "call_id": call.call_id,
                    "tool_name": call.tool_name,
                    "args": call.request_payload,
                    "risk_level": call.risk_class,
                    "by": "system",
                    "at": at.isoformat(),
                    "reason": reason,
                    "withdrawn": how,
                },
                producer=ctx.producer,
                run=run,
            )
    revised = []
    for p in proposals:
        call_id = f"{p['call_id']}#r{revision}"
        before = done.get(p["call_id"])
        if before is not None:
            if before == (p.get("args") or {}):
                continue
            append_event_once(
                ctx.session_id,
                AGENT_NOTE,
                f"again:{call_id}",
                {
                    "kind": "proposed_again",
                    "tool_name": p["tool"],
                    "risk_level": p.get("risk_class", "R0"),
                    "call_id": call_id,
                    "before": before,
                    "args": p.get("args") or {},
                    # The log stays language-neutral: pages word this note per viewer.
                    "text": f"{p['tool']} proposed again: the corrected facts change its arguments",
                },
                producer=ctx.producer,
                run=run,
            )
        revised.append({**p, "call_id": call_id})
    return revised


def done_with_args(session_id: Any, actions: list[ToolCall]) -> dict[str, dict[str, Any]]:
    """Per base call id, the arguments its latest approved or done call was proposed with:
    before any approver's edit (`approval.args_edited`), so an edit is not mistaken for a
    change of the facts. Read after a correction only."""
    latest: dict[str, ToolCall] = {}
    for call in actions:
        if call.status in DONE_OR_UNDER_WAY:
            base = base_call_id(call.call_id)
            if base not in latest or call.pk > latest[base].pk:
                latest[base] = call
    proposed = {call.pk: dict(call.request_payload) for call in latest.values()}
    if proposed:
        edits = Event.objects.filter(
            session_id=session_id,
            type=APPROVAL_ARGS_EDITED,
            payload__tool_call__in=list(proposed),
        ).order_by("-seq")
        for payload in edits.values_list("payload", flat=True):
            # Newest first: the oldest edit's "before" (the proposal's own) is set last.
            proposed[payload["tool_call"]] = dict(payload["before"])
    return {base: proposed[call.pk] for base, call in latest.items()}


def board_for(calls: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    """The closures in force that these proposals would put in force again (one query,
    none when no proposal closes anything; one more for their holders' titles when some
    are), the oldest holder of each."""
    effects = [restriction_of(c["tool"], c.get("args") or {}) for c in calls]
    wanted = {e for e in effects if e is not None}
    if not wanted:
        return {}
    held: dict[tuple[str, str], Any] = {}
    for restriction in _in_force_on().rows(sorted({target for _, target in wanted})):
        held[(restriction.kind, restriction.target)] = restriction
    if held:
        # The holders' titles, for the page to name them: one query, only when a
        # proposal meets a closure in force.
        titles = dict(
            Session.objects.filter(pk__in={r.session_id for r in held.values()}).values_list(
                "pk", "title"
            )
        )
        for restriction in held.values():
            restriction.holder_title = titles.get(restriction.session_id, "")
    return held


@cache
def _in_force_on() -> Compiled[Any]:
    """Read at every proposal step: compiled once per connection; the targets go as one
    array, so the SQL is the same whatever their number."""
    model = restrictions.model()
    return Compiled(
        model,
        lambda: model.objects.filter(AnyOf("target", 0), lifted_at__isnull=True).order_by(
            "-created_at"
        ),
    )


def note_if_in_force(
    ctx: AgentContext,
    run: AgentRun,
    call: dict[str, Any],
    made: set[str],
    board: dict[tuple[str, str], Any],
) -> bool:
    """A closure already on the board (put there by any session) is not proposed again:
    the agent says so once, naming the session that holds it. Decided at proposal time;
    a call this session already made (`made`: a re-run) is left to `propose_action`."""
    effect = restriction_of(call["tool"], call.get("args") or {})
    if effect is None or call["call_id"] in made:
        return False
    held = board.get(effect)
    if held is None:
        return False
    append_event_once(
        ctx.session_id,
        AGENT_NOTE,
        f"in_force:{call['call_id']}",
        {
            "kind": "already_in_force",
            "tool_name": call["tool"],
            "args": call.get("args") or {},
            "restriction": {"kind": effect[0], "target": effect[1]},
            "held_by": str(held.session_id),
            # Which session closed it and when: the page names and links it.
            "held_title": getattr(held, "holder_title", ""),
            "held_since": held.created_at.isoformat(),
            # The log stays language-neutral: pages word this note per viewer.
            "text": f"{call['tool']} not proposed: {effect[0]} {effect[1]} is already "
            f"closed by session {held.session_id}",
        },
        producer=ctx.producer,
        run=run,
    )
    return True


def propose_action(tctx: ToolContext, call: dict[str, Any], *, fresh: bool = False) -> None:
    """Propose an action: an R0 action is handed to the outbox at once (the proposal and
    its outbox row commit together; the effect follows the commit); R1-R3 wait for
    approval. No savepoint: it runs in the step's transaction."""
    # An R1-R3 call is inserted awaiting approval (one INSERT, no UPDATE after it).
    waits_for_people = call.get("risk_class", "R0") != "R0"
    status = ToolCallStatus.AWAITING_APPROVAL if waits_for_people else ToolCallStatus.PROPOSED
    with transaction.atomic(savepoint=False):
        tool_call, created = get_or_create_call(tctx, call, status, fresh=fresh)
        if tool_call.status in (ToolCallStatus.EXECUTING, ToolCallStatus.RUNNING):
            run_action(tctx, tool_call.pk)  # handed to the outbox before a crash: finish it
            return
        if created and tool_call.status == ToolCallStatus.AWAITING_APPROVAL:
            # Its approval is digested against the session as the log will read once
            # this group commits (the risk and impact it logged are not written yet).
            tool_call.session = logged_session(tctx)
            open_approval(tool_call, producer=tctx.producer, run=tctx.run, fresh=True)
            return
        if tool_call.status != ToolCallStatus.PROPOSED:
            return  # proposed before this re-run: already decided or executed
        if tool_call.risk_class == "R0":
            run_action(tctx, tool_call.pk)
        else:
            # Proposed before this change of status-at-insert (an older re-run).
            tool_call.status = ToolCallStatus.AWAITING_APPROVAL
            tool_call.save(update_fields=["status"])
            open_approval(tool_call, producer=tctx.producer, run=tctx.run)


def open_proposals(
    tctx: ToolContext,
    calls: list[dict[str, Any]],
    refused: Callable[[str], str | None],
    made: set[str],
    board: dict[tuple[str, str], Any],
) -> dict[str, tuple[ToolCall, dict[str, Any]]]:
    """A step that only proposes (the planner's proposals) inserts all its new calls in
    one statement and their approvals in one more, instead of two per call.
    Returns, by call id, each new call and what its approval was opened with; the step
    then logs them in the calls' order (`proposed`). Calls refused by the compliance
    check, already in force or made before (a re-run) are left to the step's loop."""
    if not calls or any(c.get("mode") != "propose" for c in calls):
        return {}
    new = [
        c
        for c in calls
        if c["call_id"] not in made and not refused(c["tool"]) and _held(c, board) is None
    ]
    if not new:
        return {}
    rows = insert_rows(
        ToolCall,
        [
            new_call(
                tctx,
                c,
                ToolCallStatus.PROPOSED
                if c.get("risk_class", "R0") == "R0"
                else ToolCallStatus.AWAITING_APPROVAL,
            )
            for c in new
        ],
    )
    waiting = [r for r in rows if r.status == ToolCallStatus.AWAITING_APPROVAL]
    approvals: dict[int, dict[str, Any]] = {}
    if waiting:
        # Digested against the session as the log will read once this group commits.
        session = logged_session(tctx)
        for _, response in approvals_required.send(
            sender=ToolCall, tool_calls=waiting, session=session
        ):
            if isinstance(response, dict):
                approvals.update(response)
    return {r.call_id: (r, approvals.get(r.pk, {})) for r in rows}


def proposed(tctx: ToolContext, tool_call: ToolCall, opened: dict[str, Any]) -> None:
    """Log a call `open_proposals` inserted: an R0 one is handed to the outbox at once;
    one awaiting approval gets its `approval.required` event."""
    if tool_call.status == ToolCallStatus.PROPOSED:
        run_action(tctx, tool_call.pk)
    else:
        log_approval_required(tool_call, opened, producer=tctx.producer, run=tctx.run)


def _held(call: dict[str, Any], board: dict[tuple[str, str], Any]) -> Any:
    effect = restriction_of(call["tool"], call.get("args") or {})
    return board.get(effect) if effect is not None else None


_session = Compiled(Session, lambda: Session.objects.filter(pk=Arg(0, Session._meta.pk)))


def session_row(session_id: Any) -> Session:
    """The session's row (compiled once per connection)."""
    return _session.get(session_id)


def logged_session(tctx: ToolContext) -> Session:
    """The session (read once per step) with the events queued in this group folded into
    its snapshot: what the approvals' state digest must be taken from."""
    if tctx.session is None:
        tctx.session = session_row(tctx.session_id)
    return as_logged(copy.copy(tctx.session))
