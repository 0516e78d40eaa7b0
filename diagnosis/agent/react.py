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

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, ValidationError

from aero.compiled import Arg, Compiled
from aero.packs import action_tool, installed_packs
from aero.text import MAX_MODEL_TEXT, cut_generated
from diagnosis.agent import budget, fsm, policy, prompts, waits
from diagnosis.agent.planning import enrichment_calls, facts_of, revision_suffix
from diagnosis.agent.providers import (
    OfflineProvider,
    OpenAICompatibleProvider,
    Provider,
    ProviderError,
    Usage,
    call_with_fallback,
    classify,
    client_for,
)
from diagnosis.agent.recording import call_recorder, fallback_recorder, skip_recorder
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.agent.tools import ENRICHMENT_SOURCES
from diagnosis.events import append_event_once
from diagnosis.models import Event, ToolCall
from scenarios_admin.definition import BUDGET_TOOL, LIFT_TOOL


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoArgs(_Args):
    """The deterministic tools read the session's fields; the model passes nothing."""


# The agent's own analyses; the lookups and actions are the packs' (aero.packs).
ANALYSES: dict[str, tuple[type[BaseModel], str]] = {
    "assess_risk": (NoArgs, "Risk level by the scenario's rule table (deterministic)."),
    "analyze_impact": (NoArgs, "Impact zone by breadth-first search on the airport graph."),
}


def tool_args() -> dict[str, tuple[type[BaseModel], str]]:
    """Every tool the model may pick, with its argument model and description: the
    packs' lookups, the analyses, the packs' actions, in that order."""
    packs = installed_packs()
    found: dict[str, tuple[type[BaseModel], str]] = {
        name: (lookup.schema, lookup.description)
        for pack in packs
        for name, lookup in pack.tools.lookups.items()
        if lookup.schema is not None
    }
    found.update(ANALYSES)
    for pack in packs:
        for name, action in pack.tools.actions.items():
            if action.schema is not None:
                found.setdefault(name, (action.schema, action.description))
    return found


def tool_schemas(definition: dict[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI tool list for a scenario: the lookups, risk, impact, and the action tools
    the scenario uses, each with the JSON schema of its pydantic argument model."""
    used = {action["tool"] for action in definition.get("actions", [])}
    # Copies: a caller may add to a schema; the cached one stays as generated.
    return [
        json.loads(_tool_schema(name))
        for name in tool_args()
        if name in used or action_tool(name) is None
    ]


@functools.cache
def _tool_schema(name: str) -> str:
    """One tool's schema, generated once per process (as JSON): pydantic's schema
    generation is costly, and every model call of every resumed step would pay it for
    the same dozen fixed models."""
    model, description = tool_args()[name]
    schema = convert_to_openai_tool(model)
    schema["function"]["name"] = name
    schema["function"]["description"] = description
    return json.dumps(schema)


# --- the conversation -----------------------------------------------------------------


# Read by every reasoning step: compiled once per connection.
_talk = Compiled(
    Event,
    lambda: (
        Event.objects.filter(
            session_id=Arg(0, Event._meta.get_field("session")),
            type__in=("user.message", "agent.note"),
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
    texts = [e.payload.get("text", "") for e in events if e.type == "user.message"]
    known = {k: v for k, v in (state.get("fields") or {}).items() if v is not None}
    messages: list[BaseMessage] = [
        SystemMessage(
            "\n".join(
                p
                for p in (ctx.definition.get("system_prompt", "").strip(), prompts.REACT[lang])
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
    turns = [e for e in events if e.type == "agent.note" and e.payload.get("kind") == "react"]
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


# --- one reasoning step ---------------------------------------------------------------


@dataclass
class Choice:
    """What the model asked for in one step and what the policy made of it: the plan that
    runs, each of the model's calls with the call it became or why it was refused, and
    every correction (an `fsm.violation` event each)."""

    plan: dict[str, Any]
    text: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    corrections: list[dict[str, Any]] = field(default_factory=list)

    @property
    def picked(self) -> list[str]:
        return [str(c.get("name")) for c in self.calls if not c.get("refused")]


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
        reply = client_for(provider.config).bind_tools(tools).invoke(messages)
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


def choose(
    provider: OpenAICompatibleProvider,
    state: AgentState,
    ctx: AgentContext,
    reference: dict[str, Any],
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


# The packs' lookups (registered when the apps are ready: read when first compiled).
_lookups_made = Compiled(
    ToolCall,
    lambda: ToolCall.objects.filter(
        session_id=Arg(0, ToolCall._meta.get_field("session")),
        tool_name__in=sorted(ENRICHMENT_SOURCES),
    ).values_list("tool_name", flat=True),
)


def decide(
    valid: list[dict[str, Any]],
    reference: dict[str, Any],
    state: AgentState,
    ctx: AgentContext,
) -> Choice:
    """The model's valid calls, checked one by one against the compliance state machine
    and the policy; the ones that pass are what runs.

    - a lookup runs with the arguments of the confirmed fields (a value the model made up
      is not looked up: the operator confirms facts, not the model);
    - risk and impact run only when the state machine allows them and only once: the
      rule table and the BFS give their results, nothing the model says changes them;
    - an action may be proposed only once the impact is known, only if the rule table
      requires it, and with the policy's arguments and risk class; every required action
      the model forgot is proposed anyway;
    - a call the state machine does not allow yet is refused, with the reason as its tool
      message; when nothing the model asked for can run, the policy's next step runs."""

    definition = ctx.definition
    fields = state.get("fields") or {}
    facts = facts_of(state, ctx)
    risk = state.get("risk")
    enrichment = state.get("enrichment") or {}
    # After a correction, the calls of revision n: the earlier results are not reused.
    suffix = revision_suffix(state)
    lookups = {
        c["tool"]: {**c, "call_id": c["call_id"] + suffix}
        for c in enrichment_calls(definition, fields)
    }
    done_lookups = set(_lookups_made.rows(ctx.session_id)) if enrichment else set()
    expected = reference.get("calls", []) if reference["step"] == "call" else []
    # The proposal step is open once risk and impact are known and nothing was proposed;
    # the policy's list of required actions is then fixed (the model may get there while
    # the policy would still look something up).
    entry_facts = facts
    required = [c for c in expected if c.get("mode") == "propose"]
    at_proposals = bool(required) or (
        bool(risk) and bool(state.get("impact")) and not state.get("actions_planned")
    )
    if at_proposals and not required:
        required = policy.required_actions(
            definition, fields, ctx.graph, risk or {}, state.get("impact") or {}
        )
        for position, proposal in enumerate(required):
            proposal.update(position=position, mode="propose")
    proposing = bool([c for c in expected if c.get("mode") == "propose"])
    unclaimed = list(required)
    choice = Choice(reference)
    plan_calls: list[dict[str, Any]] = []

    def refuse(call: dict[str, Any], why: str) -> None:
        choice.calls.append({"name": call["name"], "args": call.get("args") or {}, "refused": why})
        choice.corrections.append(
            {"tool": call["name"], "args": call.get("args") or {}, "violation": "refused: " + why}
        )

    def accept(call: dict[str, Any], planned: dict[str, Any]) -> None:
        choice.calls.append(
            {"name": call["name"], "args": call.get("args") or {}, "call_id": planned["call_id"]}
        )
        if all(p["call_id"] != planned["call_id"] for p in plan_calls):
            plan_calls.append(planned)

    for call in valid:
        name, args = call["name"], call.get("args") or {}
        if name in ENRICHMENT_SOURCES:
            if name in done_lookups or any(p["tool"] == name for p in plan_calls):
                refuse(call, f"{name} was already run; its result is in the conversation")
            elif name not in lookups:
                refuse(call, f"{name}: the field it needs is not known (confirmed) yet")
            else:
                if args != lookups[name]["args"]:
                    choice.corrections.append(
                        {
                            "tool": name,
                            "args": args,
                            "violation": f"{name} arguments set by the policy from the "
                            "confirmed fields: "
                            + json.dumps(lookups[name]["args"], ensure_ascii=False),
                        }
                    )
                accept(call, lookups[name])
        elif name == "assess_risk":
            violation = fsm.check_step(definition, facts, name)
            if risk:
                refuse(
                    call,
                    f"the risk is assessed by the rule table ({risk['rule']}: {risk['level']} "
                    f"{risk['score']}); it is neither re-run nor changed",
                )
            elif violation:
                refuse(call, violation)
            else:
                accept(call, {"call_id": "assess_risk" + suffix, "tool": "assess_risk", "args": {}})
                facts = fsm.Facts(facts.p1_complete, True, False, False, False)
        elif name == "analyze_impact":
            violation = fsm.check_step(definition, facts, name)
            if state.get("impact"):
                refuse(call, "the impact is analysed by the BFS on the airport graph already")
            elif violation:
                refuse(call, violation)
            else:
                accept(
                    call,
                    {"call_id": "analyze_impact" + suffix, "tool": "analyze_impact", "args": {}},
                )
                facts = fsm.Facts(facts.p1_complete, True, True, False, False)
        else:
            # Actions need the impact known before this step, not from the same reply:
            # the required list depends on it.
            violation = fsm.check_step(definition, entry_facts, name)
            if violation:
                refuse(call, violation)
            elif not at_proposals:
                refuse(call, f"{name}: the required actions were proposed already")
            else:
                proposing = True
                same = [c for c in unclaimed if c["tool"] == name and c["args"] == args]
                other = same or [c for c in unclaimed if c["tool"] == name]
                if not other:
                    refuse(
                        call,
                        f"{name} {json.dumps(args, ensure_ascii=False)} is not "
                        "required by the scenario's rules for this incident",
                    )
                    continue
                unclaimed.remove(other[0])
                if not same and name != "notify_atc":  # the ATC message is the model's words
                    choice.corrections.append(
                        {
                            "tool": name,
                            "args": args,
                            "violation": f"{name} arguments set by the policy: "
                            + json.dumps(other[0]["args"], ensure_ascii=False, sort_keys=True),
                        }
                    )
                accept(call, other[0])
    if proposing:
        for call in unclaimed:
            choice.corrections.append(
                {
                    "tool": call["tool"],
                    "args": call.get("args") or {},
                    "violation": f"required action {call['tool']} proposed although the model "
                    "did not call it",
                }
            )
        # All required proposals, in the policy's order (positions, stable call ids),
        # after whatever else the model asked for in the same reply.
        others = [c for c in plan_calls if c.get("mode") != "propose"]
        choice.plan = {"step": "call", "calls": others + required, "by": "model"}
    elif plan_calls:
        choice.plan = {"step": "call", "calls": plan_calls, "by": "model"}
    else:
        next_step = ", ".join(c["tool"] for c in expected) or reference["step"]
        choice.corrections.append(
            {
                "tool": "finish",
                "violation": (
                    "nothing the model asked for can run" if valid else "the model stopped early"
                )
                + f"; the policy's next step runs: {next_step}",
            }
        )
        choice.plan = reference
    return choice


def react_plan(
    state: AgentState,
    ctx: AgentContext,
    reference_plan: Callable[[AgentState, AgentContext], dict[str, Any]],
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
        return choose(provider, state, ctx, reference)

    run = ctx.root_run
    choice = call_with_fallback(
        ctx.providers,
        "reason",
        call,
        call_recorder(ctx, run),
        fallback_recorder(ctx, run),
        skip_recorder(ctx, run),
    )
    step = _step_key(state, reference)
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
            ctx.session_id, "agent.note", f"react:{step}", note, producer=ctx.producer, run=run
        )
    for index, correction in enumerate(choice.corrections):
        append_event_once(
            ctx.session_id,
            "fsm.violation",
            f"react:{step}:{index}",
            correction,
            producer=ctx.producer,
            run=run,
        )
    return choice.plan


def _step_key(state: AgentState, reference: dict[str, Any]) -> str:
    """Stable per reasoning step: what is known and what the policy does next."""
    done = [
        bool(state.get("enrichment") is not None),
        bool(state.get("risk")),
        bool(state.get("impact")),
        bool(state.get("actions_planned")),
    ]
    calls = ",".join(c.get("call_id", c["tool"]) for c in reference.get("calls", []))
    step = f"{''.join('1' if d else '0' for d in done)}:{reference['step']}:{calls}"
    # Event keys are short (varchar): a digest of the step, not the step spelled out.
    return hashlib.sha256(step.encode()).hexdigest()[:24]
