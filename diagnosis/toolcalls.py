"""A tool call's context and its record, shared by the agent's tools and the outbox: its
start and outcome (rows and events), and an action's request and result from the pack
that declares it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone, translation
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy

from aero.compiled import save_fields
from aero.packs import action_tool
from diagnosis.eventlog.names import TOOL_CALL_STARTED
from diagnosis.events import append_event
from diagnosis.execution import record_call_finished
from diagnosis.models import AgentRun, Session, ToolCall, ToolCallStatus


@dataclass
class ToolContext:
    session_id: Any
    graph: Any  # the world the session's pack acts on (DomainPack.world)
    run: AgentRun | None
    producer: str
    session: Session | None = None  # read once per step where needed (logged_session)
    definition: dict[str, Any] = field(default_factory=dict)  # the scenario's


class ToolFailure(Exception):
    pass


# Why a lookup failed, as the log says it (in English, language-neutral) and pages word
# it per reader (diagnosis.wording.failure_words reads the logged text back). The packs
# add their lookups' own (register_lookups).
FAILURES: dict[str, Promise] = {
    "timed_out": gettext_lazy("timed out after %(seconds)s s"),
}


def failure(code: str, **params: Any) -> str:
    """The failure `code` as the log keeps it: in English."""
    with translation.override("en"):
        return str(FAILURES[code]) % params


def idempotency_key(session_id: Any, call_id: str) -> str:
    return f"{session_id}:{call_id}"


def request_of(ctx: ToolContext, tool_call: ToolCall) -> tuple[str, str, dict[str, Any]]:
    """(system, operation, body) of an action call, from the pack that declares the
    action (aero.packs): the core sends it through the outbox whatever its domain."""
    declared = action_tool(tool_call.tool_name)
    if declared is None:
        raise ToolFailure(f"unknown action tool {tool_call.tool_name}")
    return declared.request(ctx, tool_call)


def result_of(ctx: ToolContext, tool_call: ToolCall, remote: dict[str, Any]) -> dict[str, Any]:
    """The action call's response from its system's answer, by its pack."""
    declared = action_tool(tool_call.tool_name)
    if declared is None:
        raise ToolFailure(f"unknown action tool {tool_call.tool_name}")
    return declared.result(ctx, tool_call, remote)


def call_started(ctx: ToolContext, tool_call: ToolCall, *, saved: bool = False) -> None:
    """`saved`: the row was just inserted as running, its first attempt counted."""
    if not saved:
        tool_call.attempts += 1
        tool_call.status = ToolCallStatus.RUNNING
        tool_call.agent_run = ctx.run
        save_fields(tool_call, ["attempts", "status", "agent_run"])
    append_event(
        ctx.session_id,
        TOOL_CALL_STARTED,
        {
            "tool_call": tool_call.pk,
            "call_id": tool_call.call_id,
            "tool_name": tool_call.tool_name,
            "args": tool_call.request_payload,
            "risk_level": tool_call.risk_class,
            "is_action": tool_call.is_action,
            "position": tool_call.position,
            "attempt": tool_call.attempts,
            "agent_run_id": ctx.run.pk if ctx.run else None,
        },
        producer=ctx.producer,
        run=ctx.run,
    )


def call_finished(
    ctx: ToolContext,
    tool_call: ToolCall,
    started: float,
    *,
    response: dict[str, Any] | None = None,
    error: str = "",
    at: datetime | None = None,
) -> None:
    tool_call.duration_ms = int((time.monotonic() - started) * 1000)
    tool_call.completed_at = at or timezone.now()
    tool_call.status = ToolCallStatus.FAILED if error else ToolCallStatus.COMPLETED
    tool_call.response_payload = response or {}
    tool_call.error = error
    save_fields(tool_call, ["duration_ms", "completed_at", "status", "response_payload", "error"])
    finished_event(ctx, tool_call, response=response or {}, error=error)


def finished_event(
    ctx: ToolContext, tool_call: ToolCall, *, response: dict[str, Any], error: str
) -> None:
    record_call_finished(
        tool_call, response=response or {}, error=error, producer=ctx.producer, run=ctx.run
    )
