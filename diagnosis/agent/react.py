"""ReAct under the rules: with a real provider the reasoning node shows the model the
conversation (the operator's messages, the fields, every tool result so far as tool
messages) and the tools, and the model picks the next calls. The compliance policy stays
in charge:

- the tools' argument schemas are generated from pydantic models (below);
- a call to an unknown tool is refused; invalid arguments get one repair turn (the
  validation error goes back as the tool message), then a recorded failure;
- every call the model picks is checked against the policy's next step (the offline
  planner): a step out of order or an action the policy does not require is refused,
  and a required action the model forgot is proposed anyway; each refusal and each
  correction is an `fsm.violation` event;
- the rule table and the BFS remain the only source of risk and impact, and the
  arguments of response actions come from the policy: the model cannot lower a risk
  class, change a rule result, or execute anything R1-R3 without a decision.

When every real provider fails, the offline provider "chooses" the policy's own step.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableBinding
from pydantic import ValidationError

from aero.text import MAX_MODEL_TEXT, cut_generated
from diagnosis.agent import budget, waits
from diagnosis.agent.choice import Choice
from diagnosis.agent.clients import classify, client_for
from diagnosis.agent.conversation import conversation
from diagnosis.agent.fallback import call_with_fallback
from diagnosis.agent.providers import OfflineProvider, OpenAICompatibleProvider, Provider
from diagnosis.agent.react_tools import tool_args, tool_schemas
from diagnosis.agent.recording import call_recorder, fallback_recorder, skip_recorder
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.agent.usage import ProviderError, Usage
from diagnosis.eventlog.names import AGENT_NOTE, FSM_VIOLATION
from diagnosis.events import append_event_once


def _validate(calls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split the model's calls into valid ones and problems (unknown tool, bad arguments)."""
    valid, problems = [], []
    args_of = tool_args()
    for call in calls:
        name = call.get("name") or ""
        if name not in args_of:
            problems.append({**call, "problem": f"unknown tool {name!r}", "repairable": False})
            continue
        if call.get("error"):
            problems.append({**call, "problem": call["error"], "repairable": True})
            continue
        try:
            args_of[name][0].model_validate(call.get("args") or {})
        except ValidationError as exc:
            problems.append({**call, "problem": str(exc), "repairable": True})
            continue
        valid.append(call)
    return valid, problems


def _calls_of(reply: AIMessage) -> list[dict[str, Any]]:
    calls = [{"name": c["name"], "args": c["args"], "id": c.get("id")} for c in reply.tool_calls]
    for bad in reply.invalid_tool_calls:
        calls.append(
            {
                "name": bad.get("name"),
                "args": {},
                "id": bad.get("id"),
                "error": f"arguments are not valid JSON: {bad.get('args')!r}",
            }
        )
    return calls


def ask_model(
    provider: OpenAICompatibleProvider, messages: list[BaseMessage], tools: list[dict[str, Any]]
) -> tuple[AIMessage, Usage]:
    try:
        bound = client_for(provider.config).bind_tools(tools)
        scope = waits.current_scope()
        if (
            scope is not None
            and scope.missing == scope.peek_key()
            and isinstance(bound, RunnableBinding)
        ):
            # Its reply is known to be missing (`stored_reply` just looked): the call is
            # a wait. Its request as LangChain's call path would hand it to the client
            # (the bound tools), without that path's callbacks and copies.
            waits.answer(scope, messages, dict(bound.kwargs))  # raises ModelWait
        reply = bound.invoke(messages)
    except Exception as exc:
        raise classify(exc, [provider.config.api_key()]) from None
    assert isinstance(reply, AIMessage)
    return reply, usage_of(provider, reply, messages, tools)


def usage_of(
    provider: OpenAICompatibleProvider,
    reply: AIMessage,
    messages: list[BaseMessage] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> Usage:
    """The reply's tokens and cost (estimated from the request and the reply when the
    provider reported none); a stored reply's are not counted again (the runner did)."""
    usage = provider.usage(reply, messages or (), {"tools": tools})
    usage.text = reply.content if isinstance(reply.content, str) else json.dumps(reply.content)
    return usage


def choose[S: AgentState](
    provider: OpenAICompatibleProvider,
    state: S,
    ctx: AgentContext,
    reference: dict[str, Any],
    decide: Callable[[list[dict[str, Any]], dict[str, Any], S, AgentContext], Choice],
) -> tuple[Choice, Usage]:
    """One model step, with one repair turn for invalid arguments, checked by the policy."""
    messages: list[BaseMessage] | None = None
    stored = waits.stored_reply()  # a resume: the reply is all it needs (not the tools)
    if stored is not None:
        assert isinstance(stored, AIMessage)  # as ask_model's reply
        reply, usage = stored, usage_of(provider, stored)
    else:
        messages = conversation(state, ctx)
        reply, usage = ask_model(provider, messages, tool_schemas(ctx.definition))
    valid, problems = _validate(_calls_of(reply))
    text = str(reply.content or "")
    if any(p["repairable"] for p in problems):
        # One repair turn: the model sees what was wrong with its arguments.
        # Every call of the reply gets its tool message (the API requires one per id).
        if messages is None:
            messages = conversation(state, ctx)
        messages.append(reply)
        for call in valid:
            messages.append(
                ToolMessage("accepted: not run yet", tool_call_id=call.get("id") or "valid")
            )
        for problem in problems:
            messages.append(
                ToolMessage(
                    "refused: " + problem["problem"], tool_call_id=problem.get("id") or "invalid"
                )
            )
        try:
            repaired, more = ask_model(provider, messages, tool_schemas(ctx.definition))
        except ProviderError as error:
            # The first reply was paid for: its tokens go on this failed attempt's record
            # (the chain's retry asks again, and records again).
            error.usage = _added(usage, error.usage)
            raise
        usage = _added(usage, more)
        valid, problems = _repaired(reply, valid, problems, repaired)
        text = str(repaired.content or text)
    choice = decide(valid, reference, state, ctx)
    choice.text = text
    for problem in problems:
        choice.calls.append(
            {
                "name": problem.get("name") or "?",
                "args": problem.get("args") or {},
                "refused": problem["problem"],
            }
        )
        choice.corrections.append(
            {"tool": problem.get("name") or "?", "violation": "refused: " + problem["problem"]}
        )
    return choice, usage


def _added(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.tokens_in + b.tokens_in,
        a.tokens_out + b.tokens_out,
        a.cost + b.cost,
        b.text or a.text,
        estimated=a.estimated or b.estimated,  # partly estimated: marked as estimated
    )


def _repaired(
    first: AIMessage,
    valid: list[dict[str, Any]],
    problems: list[dict[str, Any]],
    repaired: AIMessage,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The step after a repair turn. The first reply's valid calls were answered
    "accepted: not run yet", so they stay (a model that sends them again does not run
    them twice), with the repaired reply's valid calls, in the order the model first gave
    its tools; the first reply's refusals that no repair could mend (an unknown tool)
    stay recorded; the repaired reply's problems are failures."""
    more, failed = _validate(_calls_of(repaired))

    def signature(call: dict[str, Any]) -> str:
        return json.dumps([call.get("name"), call.get("args") or {}], sort_keys=True)

    seen = {signature(call) for call in valid}
    merged = valid + [call for call in more if signature(call) not in seen]
    order = [call.get("name") for call in _calls_of(first)]
    merged.sort(key=lambda c: order.index(c["name"]) if c["name"] in order else len(order))
    for problem in failed:
        problem["problem"] += " (after a repair turn)"
    return merged, [p for p in problems if not p["repairable"]] + failed


def react_plan[S: AgentState](
    state: S,
    ctx: AgentContext,
    reference_plan: Callable[[S, AgentContext], dict[str, Any]],
    decide: Callable[[list[dict[str, Any]], dict[str, Any], S, AgentContext], Choice],
    progress: Callable[[S], str],
) -> dict[str, Any]:
    """The next step, chosen by the model and checked by the policy (see the module doc)."""
    reference = reference_plan(state, ctx)
    real = [p for p in ctx.providers if isinstance(p, OpenAICompatibleProvider)]
    if not real or not settings.AERO_LLM_REACT:
        return reference
    if reference["step"] != "call" or any(
        c.get("mode") == "execute" for c in reference.get("calls", [])
    ):
        # Questions, waits, the report and running decided actions follow the facts and
        # the decisions, not the model.
        return reference

    paused = budget.check(state, ctx, real)
    if paused is not None:
        return paused

    def call(provider: Provider) -> tuple[Choice, Usage]:
        if isinstance(provider, OfflineProvider):
            return Choice(reference), Usage()
        if not isinstance(provider, OpenAICompatibleProvider):
            raise ProviderError(
                f"{provider.name} cannot reason", retryable=False, error_class="other"
            )
        return choose(provider, state, ctx, reference, decide)

    run = ctx.root_run
    choice = call_with_fallback(
        ctx.providers,
        "reason",
        call,
        call_recorder(ctx, run),
        fallback_recorder(ctx, run),
        skip_recorder(ctx, run),
    )
    step = _step_key(progress(state), reference)
    if choice.text or choice.calls or choice.plan is not reference:
        # The model's words are not bounded by anything a person typed: a runaway reply
        # is kept up to MAX_MODEL_TEXT, marked as cut in the text and the payload.
        text, cut_from = cut_generated(choice.text or "", MAX_MODEL_TEXT)
        note: dict[str, Any] = {
            "kind": "react",
            "text": text,
            "picked": choice.picked,
            "calls": choice.calls,
            "step": reference["step"],
        }
        if cut_from is not None:
            note["cut_from_chars"] = cut_from
        append_event_once(
            ctx.session_id, AGENT_NOTE, f"react:{step}", note, producer=ctx.producer, run=run
        )
    for index, correction in enumerate(choice.corrections):
        append_event_once(
            ctx.session_id,
            FSM_VIOLATION,
            f"react:{step}:{index}",
            correction,
            producer=ctx.producer,
            run=run,
        )
    return choice.plan


def _step_key(known: str, reference: dict[str, Any]) -> str:
    """Stable per reasoning step: what is known (the pack's `progress` of the state) and
    what the policy does next."""
    calls = ",".join(c.get("call_id", c["tool"]) for c in reference.get("calls", []))
    step = f"{known}:{reference['step']}:{calls}"
    # Event keys are short (varchar): a digest of the step, not the step spelled out.
    return hashlib.sha256(step.encode()).hexdigest()[:24]
