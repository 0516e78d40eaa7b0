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
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from aero.text import MAX_MODEL_TEXT, cut_generated
from diagnosis.agent import prompts
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
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.events import append_event_once
from diagnosis.models import Event, ToolCall


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FlightArgs(_Args):
    flight_no: str = Field(description="flight number, e.g. CA1234")


class PositionArgs(_Args):
    position: str = Field(description="stand, taxiway node or runway designator")


class NoArgs(_Args):
    """The deterministic tools read the session's fields; the model passes nothing."""


class MessageArgs(_Args):
    message: str


class StandArgs(_Args):
    stand: str


class TaxiwayArgs(_Args):
    taxiway: str = Field(description="taxiway letter, e.g. A")


class RunwayArgs(_Args):
    runway: str = Field(description="runway designator, e.g. 06/24")


class TowArgs(_Args):
    flight_no: str
    position: str


TOOL_ARGS: dict[str, tuple[type[BaseModel], str]] = {
    "lookup_aircraft_info": (FlightArgs, "Aircraft type, airline and registration of a flight."),
    "lookup_flight_plan": (FlightArgs, "Schedule, destination and passengers of a flight."),
    "lookup_stand_location": (PositionArgs, "Where a stand or node is and what is next to it."),
    "assess_risk": (NoArgs, "Risk level by the scenario's rule table (deterministic)."),
    "analyze_impact": (NoArgs, "Impact zone by breadth-first search on the airport graph."),
    "notify_atc": (MessageArgs, "Notify air traffic control (R0, automatic)."),
    "dispatch_cleanup_crew": (PositionArgs, "Send the cleanup crew (R1)."),
    "request_fire_standby": (PositionArgs, "Ask the fire service to stand by (R1)."),
    "suspend_stand_operations": (StandArgs, "Suspend operations at a stand (R2)."),
    "close_taxiway": (TaxiwayArgs, "Close a taxiway (R2)."),
    "close_runway": (RunwayArgs, "Close a runway (R3)."),
    "runway_inspection": (RunwayArgs, "Inspect a runway (R1)."),
    "fod_sweep": (PositionArgs, "Sweep foreign object debris (R1)."),
    "tow_aircraft": (TowArgs, "Tow an aircraft away (R1)."),
}


def tool_schemas(definition: dict[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI tool list for a scenario: the lookups, risk, impact, and the action tools
    the scenario uses, each with the JSON schema of its pydantic argument model."""
    used = {action["tool"] for action in definition.get("actions", [])}
    schemas = []
    for name, (model, description) in TOOL_ARGS.items():
        if name in used or not _is_action(name):
            schema = convert_to_openai_tool(model)
            schema["function"]["name"] = name
            schema["function"]["description"] = description
            schemas.append(schema)
    return schemas


def _is_action(name: str) -> bool:
    return name not in (
        "lookup_aircraft_info",
        "lookup_flight_plan",
        "lookup_stand_location",
        "assess_risk",
        "analyze_impact",
    )


# --- the conversation -----------------------------------------------------------------


def conversation(state: AgentState, ctx: AgentContext) -> list[BaseMessage]:
    """The operator's messages and every tool result so far, rebuilt from the session."""
    lang = prompts.language(state.get("language", "en"))
    texts = [
        e.payload.get("text", "")
        for e in Event.objects.filter(session_id=ctx.session_id, type="user.message").order_by(
            "seq"
        )
    ]
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
    calls = ToolCall.objects.filter(session_id=ctx.session_id).order_by("id")
    for call in calls:
        call_id = f"aero_{call.pk}"
        messages.append(
            AIMessage(
                "",
                tool_calls=[{"name": call.tool_name, "args": call.request_payload, "id": call_id}],
            )
        )
        result = {"status": call.status, "result": call.response_payload}
        messages.append(
            ToolMessage(json.dumps(result, ensure_ascii=False, default=str), tool_call_id=call_id)
        )
    return messages


# --- one reasoning step ---------------------------------------------------------------


@dataclass
class Choice:
    """What the model asked for in one step, checked against the policy."""

    plan: dict[str, Any]
    text: str = ""
    picked: list[str] = field(default_factory=list)
    corrections: list[dict[str, Any]] = field(default_factory=list)


def _validate(calls: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Split the model's calls into valid ones and problems (unknown tool, bad arguments)."""
    valid, problems = [], []
    for call in calls:
        name = call.get("name") or ""
        if name not in TOOL_ARGS:
            problems.append({**call, "problem": f"unknown tool {name!r}", "repairable": False})
            continue
        if call.get("error"):
            problems.append({**call, "problem": call["error"], "repairable": True})
            continue
        try:
            TOOL_ARGS[name][0].model_validate(call.get("args") or {})
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
    meta: dict[str, Any] = dict(reply.usage_metadata or {})
    tokens_in, tokens_out = int(meta.get("input_tokens", 0)), int(meta.get("output_tokens", 0))
    return reply, Usage(tokens_in, tokens_out, provider.cost(tokens_in, tokens_out))


def choose(
    provider: OpenAICompatibleProvider,
    state: AgentState,
    ctx: AgentContext,
    reference: dict[str, Any],
) -> tuple[Choice, Usage]:
    """One model step, with one repair turn for invalid arguments, checked by the policy."""
    messages = conversation(state, ctx)
    tools = tool_schemas(ctx.definition)
    reply, usage = ask_model(provider, messages, tools)
    valid, problems = _validate(_calls_of(reply))
    choice = Choice(reference, text=str(reply.content or ""))
    if any(p["repairable"] for p in problems):
        # One repair turn: the model sees what was wrong with its arguments.
        # Every call of the reply gets its tool message (the API requires one per id).
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
        repaired, more = ask_model(provider, messages, tools)
        usage = Usage(
            usage.tokens_in + more.tokens_in,
            usage.tokens_out + more.tokens_out,
            usage.cost + more.cost,
        )
        valid, problems = _validate(_calls_of(repaired))
        choice.text = str(repaired.content or choice.text)
        for problem in problems:
            problem["problem"] += " (after a repair turn)"
    for problem in problems:
        choice.corrections.append(
            {"tool": problem.get("name") or "?", "violation": "refused: " + problem["problem"]}
        )
    choice.picked = [c["name"] for c in valid]
    choice.corrections += check_against_policy(valid, reference)
    return choice, usage


def check_against_policy(
    valid: list[dict[str, Any]], reference: dict[str, Any]
) -> list[dict[str, Any]]:
    """The policy's step is what runs; every difference from it is a recorded correction."""
    expected = reference.get("calls", []) if reference["step"] == "call" else []
    expected_tools = [c["tool"] for c in expected]
    next_step = ", ".join(expected_tools) or reference["step"]
    corrections: list[dict[str, Any]] = []
    for call in valid:
        if call["name"] not in expected_tools:
            corrections.append(
                {
                    "tool": call["name"],
                    "args": call.get("args") or {},
                    "violation": f"refused: {call['name']} is not the policy's next step "
                    f"({next_step})",
                }
            )
    unmatched = [(c["name"], c.get("args") or {}) for c in valid]
    for call in expected:
        if not call.get("is_action"):
            continue
        tool, args = call["tool"], call.get("args") or {}
        same = [m for m in unmatched if m[0] == tool and (m[1] == args or tool == "notify_atc")]
        if same:  # notify_atc's message is the model's to word, not its to decide
            unmatched.remove(same[0])
            continue
        other = next((m for m in unmatched if m[0] == tool), None)
        if other is None:
            corrections.append(
                {
                    "tool": tool,
                    "args": args,
                    "violation": f"required action {tool} proposed although the model "
                    "did not call it",
                }
            )
            continue
        unmatched.remove(other)
        corrections.append(
            {
                "tool": tool,
                "args": other[1],
                "violation": f"{tool} arguments set by the policy: "
                + json.dumps(args, ensure_ascii=False, sort_keys=True),
            }
        )
    if expected and not valid and not any(c.get("is_action") for c in expected):
        corrections.append(
            {"tool": "finish", "violation": f"the model stopped early; next step: {next_step}"}
        )
    return corrections


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
    if reference["step"] in ("ask", "await") or any(
        c.get("mode") == "execute" for c in reference.get("calls", [])
    ):
        # Questions, waits and running decided actions follow the decisions, not the model.
        return reference

    from diagnosis.agent.graph import _fallback_recorder, _recorder

    def call(provider: Provider) -> tuple[Choice, Usage]:
        if isinstance(provider, OfflineProvider):
            return Choice(reference, picked=["(policy)"]), Usage()
        if not isinstance(provider, OpenAICompatibleProvider):
            raise ProviderError(f"{provider.name} cannot reason", retryable=False)
        return choose(provider, state, ctx, reference)

    run = ctx.root_run
    choice = call_with_fallback(
        ctx.providers, "reason", call, _recorder(ctx, run), _fallback_recorder(ctx, run)
    )
    step = _step_key(state, reference)
    if choice.text or choice.picked:
        # The model's words are not bounded by anything a person typed: a runaway reply
        # is kept up to MAX_MODEL_TEXT, marked as cut in the text and the payload (ADR 37).
        text, cut_from = cut_generated(choice.text or "", MAX_MODEL_TEXT)
        note: dict[str, Any] = {"text": text, "picked": choice.picked, "step": reference["step"]}
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
    return reference


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
