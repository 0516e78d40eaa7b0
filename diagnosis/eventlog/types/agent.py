"""How the agent worked: its steps and notes, its model calls, the compliance states it
moved through and its model budget."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from django.utils.translation import gettext as _

from aero.text import MAX_MODEL_TEXT
from diagnosis.eventlog import names
from diagnosis.eventlog.registry import ByKey, EventType, Payload
from diagnosis.eventlog.state import EventLike, FoldState
from diagnosis.wording import FSM_LABELS, NODE_LABELS, plain, step_summary_words

# An action's arguments and results are the airport's closures: read-only viewers see
# neither for R2/R3 actions, nor where an edit or a correction names them.
ACTION_SECRETS = ("args", "before", "response", "error", "call_id")
SECRET_RISKS = ("R2", "R3")
# Raw model input and output, where a provider records them.
MODEL_SECRETS = ("prompt", "messages", "response", "raw")


def args_text(args: Any) -> str:
    """Arguments as k=v pairs, or the word a masked value was replaced by."""
    if not isinstance(args, dict):
        return str(args or "")
    return ", ".join(f"{k}={v}" for k, v in args.items())


class AgentNote(Payload):
    text: str = ""
    kind: str = ""


def _note(state: FoldState, event: EventLike) -> None:
    state.notes.append(event.payload.get("text", ""))


def _note_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any] | None:
    if p.get("kind") == "scenario_mismatch":
        # The session page offers the switch while the session runs.
        return {**snapshot, "scenario_mismatch": dict(p["suggested"])}
    return None


def _note_words(p: dict[str, Any]) -> str:
    if p.get("outcome"):
        return _("continuing without %(tool)s (%(outcome)s): %(reason)s") % {
            "tool": p.get("tool_name", ""),
            "outcome": p.get("outcome"),
            "reason": p.get("reason") or "—",
        }
    if p.get("kind") == "already_in_force":
        return _("%(tool)s not proposed: already in force (session %(session)s)") % {
            "tool": p.get("tool_name", ""),
            "session": p.get("held_by", ""),
        }
    if p.get("kind") == "proposed_again":
        return _("%(tool)s again, the corrected facts change it: %(before)s -> %(after)s") % {
            "tool": p.get("tool_name", ""),
            "before": args_text(p.get("before")),
            "after": args_text(p.get("args")),
        }
    return str(p.get("text", ""))


_NOTE_LINE = ByKey(
    "kind",
    {
        "already_in_force": "agent-note-already-in-force",
        "proposed_again": "agent-note-proposed-again",
    },
    default=ByKey(
        "outcome",
        {"rejected": "agent-note-rejected"},
        any_value="agent-note-outcome",
        default="agent-note",
    ),
)


class NodeEvent(Payload):
    node: str = ""


def _node_words(p: dict[str, Any]) -> str:
    node = plain(NODE_LABELS, p["node"]) if p.get("node") else ""
    summary = step_summary_words(p.get("summary"))
    return " ".join(str(v) for v in (node, summary, p.get("error")) if v)


class LLMCall(Payload):
    provider: str = ""
    purpose: str = ""
    status: str = ""
    tokens_in: int | None = None
    tokens_out: int | None = None
    # The provider reported no usage: the tokens are AERO's estimate (model-calls.md).
    estimated: bool = False
    # Why a failed attempt failed (diagnosis.agent.usage.ErrorClass).
    error_class: str = ""
    # What the attempt did to the provider's circuit breaker: opened or closed it.
    breaker: Literal["", "opened", "closed"] = ""


def _llm_call(state: FoldState, event: EventLike) -> None:
    p = event.payload
    state.llm_calls += 1
    state.tokens_in += int(p.get("tokens_in") or 0)
    state.tokens_out += int(p.get("tokens_out") or 0)
    state.cost += Decimal(str(p.get("cost") or 0))
    state.tokens_estimated = state.tokens_estimated or bool(p.get("estimated"))


def _llm_call_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any] | None:
    changed = None
    if p.get("estimated") and not snapshot.get("usage_estimated"):
        # The session's token counts include an estimate from now on: its pages say so.
        changed = snapshot = {**snapshot, "usage_estimated": True}
    if not (p.get("request") and p.get("status") == "ok"):
        return changed
    thinking = {
        "request": p["request"],
        "purpose": p.get("purpose", ""),
        "status": "done",
        "provider": p.get("provider", ""),
        "text": p.get("text", ""),
    }
    return {**snapshot, "thinking": thinking}


def _llm_call_words(p: dict[str, Any]) -> str:
    words = _("%(provider)s %(purpose)s %(status)s, tokens in/out %(tokens)s") % {
        "provider": p.get("provider"),
        "purpose": p.get("purpose"),
        "status": p.get("status"),
        "tokens": f"{p.get('tokens_in', 0)}/{p.get('tokens_out', 0)}",
    }
    return f"{words} {_('(estimated)')}" if p.get("estimated") else words


class LLMDelta(Payload):
    text: str = ""


def _delta_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    # The model's text as it streams; a new attempt starts a new text.
    current = snapshot.get("thinking") or {}
    same = (current.get("request"), current.get("attempt")) == (p.get("request"), p.get("attempt"))
    text = (current.get("text", "") if same else "") + p.get("text", "")
    thinking = {
        "request": p.get("request"),
        "attempt": p.get("attempt"),
        "purpose": p.get("purpose", ""),
        "status": "pending",
        "text": text[-MAX_MODEL_TEXT:],
    }
    return {**snapshot, "thinking": thinking}


def _fallback(state: FoldState, event: EventLike) -> None:
    state.fallbacks.append(dict(event.payload))


def _fallback_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any] | None:
    if p.get("request") and p.get("to") == "offline":
        return {**snapshot, "thinking": {"request": p["request"], "status": "failed", "text": ""}}
    return None


class LLMSkipped(Payload):
    """A provider the chain did not try: its circuit breaker is open (or, half-open,
    another call is its probe). `to`: the provider the call went on to."""

    provider: str
    to: str = ""
    state: Literal["open", "half_open"] = "open"
    until: str = ""
    purpose: str = ""


def _skipped(state: FoldState, event: EventLike) -> None:
    state.fallbacks.append({**event.payload, "skipped": True})


def _skipped_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any] | None:
    # Skipped on to the offline provider: no model text comes for this call.
    return _fallback_snapshot(snapshot, p)


class SlowCall(Payload):
    """A slow tool's call, made by the runner while the session waited: its outcome."""

    tool: str
    request: str
    status: Literal["ok", "error"]
    error: str = ""
    latency_ms: int = 0


def _slow_call_words(p: dict[str, Any]) -> str:
    names = {"tool": p.get("tool", ""), "ms": p.get("latency_ms", 0), "error": p.get("error")}
    if p.get("status") == "ok":
        return _("Slow tool %(tool)s answered in %(ms)s ms") % names
    return _("Slow tool %(tool)s failed after %(ms)s ms: %(error)s") % names


def _skipped_words(p: dict[str, Any]) -> str:
    names = {"provider": p.get("provider", ""), "to": p.get("to", "")}
    if p.get("state") == "open":
        return (
            _("Model provider %(provider)s skipped (circuit breaker open), going on to %(to)s")
            % names
        )
    return (
        _("Model provider %(provider)s skipped (circuit breaker half-open), going on to %(to)s")
        % names
    )


class FsmTransition(Payload):
    to: str


def _fsm_words(p: dict[str, Any]) -> str:
    return f"{plain(FSM_LABELS, p.get('from'))} → {plain(FSM_LABELS, p.get('to'))}"


def _violation(state: FoldState, event: EventLike) -> None:
    state.violations.append(dict(event.payload))


def _budget(state_name: str) -> Any:
    """The model budget: paused with what was spent, raised, or stopped."""

    def step(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
        budget = {**(snapshot.get("budget") or {}), **p, "state": state_name}
        return {**snapshot, "budget": budget}

    return step


def _line(name: str) -> str:
    return name.replace(".", "-").replace("_", "-")


TYPES = (
    EventType(
        names.AGENT_NOTE,
        AgentNote,
        reduce=_note,
        snapshot=_note_snapshot,
        summary=_note_words,
        line=_NOTE_LINE,
        masked=ACTION_SECRETS,
        masked_at=SECRET_RISKS,
    ),
    *(
        EventType(
            name,
            NodeEvent,
            summary=_node_words,
            line=_line(name),
            internal=name != names.AGENT_NODE_FAILED,
        )
        for name in (names.AGENT_NODE_STARTED, names.AGENT_NODE_COMPLETED, names.AGENT_NODE_FAILED)
    ),
    EventType(
        names.LLM_CALL,
        LLMCall,
        reduce=_llm_call,
        snapshot=_llm_call_snapshot,
        summary=_llm_call_words,
        line=_line(names.LLM_CALL),
        internal=True,
        masked=MODEL_SECRETS,
        panels=frozenset({"session-thinking", "session-status"}),
    ),
    EventType(
        names.LLM_DELTA,
        LLMDelta,
        snapshot=_delta_snapshot,
        line=_line(names.LLM_DELTA),
        # The live text is the thinking panel; the final text is llm.call's.
        internal=True,
        masked=MODEL_SECRETS,
        panels=frozenset({"session-thinking"}),
    ),
    EventType(
        names.LLM_FALLBACK,
        reduce=_fallback,
        snapshot=_fallback_snapshot,
        line=_line(names.LLM_FALLBACK),
        internal=True,
        masked=MODEL_SECRETS,
    ),
    EventType(
        names.LLM_SKIPPED,
        LLMSkipped,
        reduce=_skipped,
        snapshot=_skipped_snapshot,
        summary=_skipped_words,
        line=_line(names.LLM_SKIPPED),
        internal=True,
    ),
    EventType(
        names.TOOL_SLOW_CALL,
        SlowCall,
        summary=_slow_call_words,
        line=_line(names.TOOL_SLOW_CALL),
        internal=True,
    ),
    EventType(
        names.FSM_TRANSITION,
        FsmTransition,
        snapshot=lambda snapshot, p: {**snapshot, "fsm": p["to"]},
        summary=_fsm_words,
        line=_line(names.FSM_TRANSITION),
        internal=True,
        panels=frozenset({"session-facts"}),
    ),
    EventType(
        names.FSM_VIOLATION,
        reduce=_violation,
        # A conclusion's citations checked against the session's tool results, and a
        # model's conclusion against the pack's findings (a pack's checks).
        line=ByKey(
            "kind",
            {
                "foreign_evidence": "fsm-violation-foreign-evidence",
                "uncited_conclusion": "fsm-violation-uncited-conclusion",
                # a model's conclusion the pack's own findings do not bear out
                "outside_findings": "fsm-violation-outside-findings",
                "outranked": "fsm-violation-outranked",
            },
            default=_line(names.FSM_VIOLATION),
        ),
    ),
    EventType(
        names.BUDGET_EXHAUSTED, snapshot=_budget("paused"), line=_line(names.BUDGET_EXHAUSTED)
    ),
    EventType(names.BUDGET_RAISED, snapshot=_budget("running"), line=_line(names.BUDGET_RAISED)),
    EventType(names.BUDGET_STOPPED, snapshot=_budget("stopped"), line=_line(names.BUDGET_STOPPED)),
)
