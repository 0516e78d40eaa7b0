"""The conversation a ReAct step shows the model, rebuilt from the session's log."""

from __future__ import annotations

import json
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from aero.compiled import Arg, Compiled
from diagnosis.agent import prompts
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.eventlog.names import AGENT_NOTE, USER_MESSAGE
from diagnosis.models import Event, ToolCall
from scenarios_admin.definition import BUDGET_TOOL, LIFT_TOOL

# Read by every reasoning step: compiled once per connection.
_talk = Compiled(
    Event,
    lambda: (
        Event.objects.filter(
            session_id=Arg(0, Event._meta.get_field("session")),
            type__in=(USER_MESSAGE, AGENT_NOTE),
        )
        .order_by("seq")
        .only("seq", "ts", "type", "payload")
    ),
)
_agent_calls = Compiled(
    ToolCall,
    lambda: ToolCall.objects.filter(session_id=Arg(0, ToolCall._meta.get_field("session"))).exclude(
        tool_name__in=(BUDGET_TOOL, LIFT_TOOL)  # people's requests, not the agent's tools
    ),
)


def conversation(state: AgentState, ctx: AgentContext) -> list[BaseMessage]:
    """The operator's messages, the model's earlier picks and every tool result so far,
    rebuilt from the session's log each step (no state of its own to lose or repeat).

    A step the model chose is its `agent.note` (`kind=react`) with the calls it made,
    each answered by a tool message: the call's result, or why it was refused. Calls the
    policy ran without the model's pick (a forgotten required action, the offline
    fallback, an approved action executing) appear as the policy's own tool calls."""
    lang = prompts.language(state.get("language", "en"))
    events = list(_talk.rows(ctx.session_id))
    texts = [e.payload.get("text", "") for e in events if e.type == USER_MESSAGE]
    known = {k: v for k, v in (state.get("fields") or {}).items() if v is not None}
    messages: list[BaseMessage] = [
        SystemMessage(
            "\n".join(
                p
                for p in (
                    ctx.definition.get("system_prompt", "").strip(),
                    prompts.react_instructions(ctx.definition, lang),
                )
                if p
            )
        ),
        HumanMessage(
            "\n".join(texts)
            + "\n\n"
            + prompts.KNOWN_FIELDS[lang]
            + " "
            + json.dumps(known, ensure_ascii=False, sort_keys=True)
        ),
    ]
    calls = {c.call_id: c for c in _agent_calls.rows(ctx.session_id)}
    turns = [e for e in events if e.type == AGENT_NOTE and e.payload.get("kind") == "react"]
    named = {
        str(c.get("call_id"))
        for turn in turns
        for c in turn.payload.get("calls", [])
        if c.get("call_id")
    }
    # The model's turns and the policy's own calls, in the order they happened.
    timeline: list[tuple[Any, int, Any]] = [(t.ts, 0, t) for t in turns]
    timeline += [(c.created_at, 1, c) for c in calls.values() if c.call_id not in named]
    timeline.sort(key=lambda item: (item[0], item[1], getattr(item[2], "pk", 0)))
    for index, (_, _, item) in enumerate(timeline):
        if isinstance(item, ToolCall):
            turn = [(item.tool_name, item.request_payload, _result(item))]
            messages += _tool_turn("", turn, index)
            continue
        picked = [
            (
                str(c.get("name") or "?"),
                c.get("args") or {},
                _result(calls[c["call_id"]])
                if c.get("call_id") in calls
                else "refused: " + str(c.get("refused") or "not run"),
            )
            for c in item.payload.get("calls", [])
        ]
        messages += _tool_turn(str(item.payload.get("text", "")), picked, index)
    return messages


def _result(call: ToolCall) -> str:
    return json.dumps(
        {"status": call.status, "result": call.response_payload, "error": call.error or None},
        ensure_ascii=False,
        default=str,
    )


def _tool_turn(text: str, calls: list[tuple[str, Any, str]], index: int) -> list[BaseMessage]:
    """One assistant message with its calls and one tool message per call (the API wants
    an answer to every id; ids are ours, so a model reusing "call_1" each turn is fine)."""
    if not calls:
        return [AIMessage(text)] if text else []
    ids = [f"aero_{index}_{n}" for n in range(len(calls))]
    turn: list[BaseMessage] = [
        AIMessage(
            text,
            tool_calls=[
                {"name": name, "args": args if isinstance(args, dict) else {}, "id": call_id}
                for (name, args, _), call_id in zip(calls, ids, strict=True)
            ],
        )
    ]
    turn += [
        ToolMessage(content, tool_call_id=call_id)
        for (_, _, content), call_id in zip(calls, ids, strict=True)
    ]
    return turn
