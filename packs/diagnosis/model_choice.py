"""With a model configured, the model chooses the evidence calls and words the conclusion,
in every run mode (DIAGNOSIS.md §4): ReAct's next call, plan-execute's plan, and the
conclusion's words. The model's calls go through the core's chain (retries, the breaker,
the offline provider last) and are waits like every model call when waits are on.

The playbook bounds it:
- the model picks from the evidence tools (their pydantic argument models are the
  tools' schemas); a read of a source is the read the bundle warrants (its window), a
  read made already or of a source the bundle lacks is refused, other arguments are
  checked when the call runs (a bad one fails that call, recorded);
- the root cause the model names must be the one the playbook's findings rank first:
  another candidate, or one outside the findings, is a compliance violation and the
  playbook's conclusion is recorded instead;
- the conclusion cites evidence ids of this session's tool results: a foreign id is
  dropped, a conclusion left citing none is a violation and is corrected (the
  playbook's, citing its calls); neither is ever reported as the model wrote it.

The offline provider chooses what the playbook would (the caller's offline choice), so
with no model, or every model failing, a session concludes exactly as it does offline."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, Field, ValidationError

from aero.text import MAX_MODEL_TEXT, cut_generated
from diagnosis.agent import budget
from diagnosis.agent.clients import classify, client_for
from diagnosis.agent.fallback import call_with_fallback
from diagnosis.agent.providers import OfflineProvider, OpenAICompatibleProvider, Provider
from diagnosis.agent.recording import (
    call_recorder,
    fallback_recorder,
    skip_recorder,
    step_group,
)
from diagnosis.agent.state import AgentContext
from diagnosis.agent.usage import ProviderError, Usage
from diagnosis.eventlog.names import AGENT_NOTE, BUDGET_STOPPED
from diagnosis.events import append_event_once, append_step_event
from diagnosis.models import AgentRun, ToolCall
from packs.diagnosis import citations
from packs.diagnosis.investigation import ORDER, Investigation
from packs.diagnosis.playbook_data import Playbook
from packs.diagnosis.tool_args import EVIDENCE_ARGS, BadArguments, checked
from scenarios_admin.definition import BUDGET_TOOL

# How many calls a session makes before the model may ask only for the playbook's.
MAX_CALLS = 40
# The kinds of violation a model's conclusion can add to the citations' own.
OUTSIDE = "outside_findings"
OUTRANKED = "outranked"
# What each tool does, for the model (the argument models say how to call it).
DESCRIPTIONS = {
    "log_signatures": "ERROR log messages grouped by signature over the incident's window, "
    "with counts and which are new",
    "anomalies": "metric anomalies over the incident's window (onset, baseline, peak)",
    "deploys": "the deploys around the incident",
    "config_changes": "the configuration changes around the incident",
    "commits": "the commits of the system's repository around the incident, with the "
    "files and lines each changed",
    "topology": "a service's callers and dependencies in the service graph",
    "similar_cases": "past cases like this incident in the knowledge base",
    "code": "the diff hunk and lines of a file at a commit",
    "log_search": "log lines by service, level, text and window",
    "metric_query": "one metric's samples for one service",
}
# The reads of a source: made over the incident's window, as the bundle warrants them.
READS = ("log_signatures", "anomalies", "deploys", "config_changes", "commits", "similar_cases")
SYSTEM = (
    "You diagnose an IT incident from evidence. Call the evidence tools you need, one "
    "or more at a time; each result comes back with its evidence id in brackets. When "
    "you have enough evidence, call no tool. Name a root cause only from the evidence, "
    "and cite the ids of the results it rests on."
)


def model_reasons(ctx: AgentContext) -> bool:
    """Whether a model chooses this session's calls and words (a real provider is
    configured and AERO_LLM_REACT is on)."""
    return bool(settings.AERO_LLM_REACT) and any(
        isinstance(p, OpenAICompatibleProvider) for p in ctx.providers
    )


# What the model budget lets a step do: ask the model, wait for a person to let it go
# on, or choose offline (continuing was refused).
ASK, AWAIT, OFFLINE = "ask", "await", "offline"


def budget_gate(state: Any, ctx: AgentContext, run: AgentRun) -> str:
    """Before a step asks the model: the session's model budget checked as the core's
    reasoning step checks it (diagnosis.agent.budget). Spent: an R1 request to continue
    opens (`budget.exhausted`) and the step waits for it (AWAIT); refused or timed out:
    `budget.stopped` once, and this step and every later one choose offline, as the
    playbook would (OFFLINE)."""
    if not model_reasons(ctx):
        return OFFLINE
    real = [p for p in ctx.providers if isinstance(p, OpenAICompatibleProvider)]
    paused = budget.check(state, ctx, real)
    if paused is None:
        return ASK
    if paused["step"] == "await":
        return AWAIT
    request = paused["request"]
    outcome, by, reason = budget.stop_reason(request)
    append_event_once(
        ctx.session_id,
        BUDGET_STOPPED,
        f"budget:{request}:stopped",
        {"tool_call": request, "outcome": outcome, "by": by, "reason": reason},
        producer=ctx.producer,
        run=run,
    )
    return OFFLINE


def budget_refused(ctx: AgentContext) -> bool:
    """Whether continuing past the model budget was refused (its last request): a
    specialist then chooses offline. A specialist never opens a request itself: the
    orchestrator checked the budget before it split the work."""
    if not model_reasons(ctx):
        return False
    last = (
        ToolCall.objects.filter(session_id=ctx.session_id, tool_name=BUDGET_TOOL)
        .order_by("-id")
        .values_list("status", flat=True)
        .first()
    )
    return last in budget.STOPPED


@functools.cache
def _schema(tool: str) -> str:
    """One evidence tool's OpenAI schema, from its argument model (generated once)."""
    schema = convert_to_openai_tool(EVIDENCE_ARGS[tool])
    schema["function"]["name"] = tool
    schema["function"]["description"] = DESCRIPTIONS.get(tool, tool)
    return json.dumps(schema)


def tool_schemas(tools: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The evidence tools' schemas (`tools`: only those)."""
    return [json.loads(_schema(tool)) for tool in tools or tuple(EVIDENCE_ARGS)]


def conversation(
    inv: Investigation, evidence: list[dict[str, Any]], role: str = ""
) -> list[BaseMessage]:
    """The incident, then every call made so far answered by its result (its id first),
    rebuilt from the evidence at every step: no conversation lives outside the log.
    `role`: whose conversation it is (a specialist's)."""
    incident = inv.bundle.incident
    facts = {
        "title": incident.title,
        "description": incident.description,
        "services": list(incident.services),
        "problem_type": incident.problem_type or "",
        "window": inv.window,
        "sources": sorted(name for name, held in inv.bundle.sources.items() if held),
    }
    messages: list[BaseMessage] = [
        SystemMessage(SYSTEM),
        HumanMessage(
            (f"You are the {role} of this diagnosis.\n" if role else "")
            + "Incident:\n"
            + json.dumps(facts, ensure_ascii=False, default=str)
        ),
    ]
    for item in evidence:
        messages.append(
            AIMessage("", tool_calls=[{"id": item["id"], "name": item["tool"], "args": {}}])
        )
        messages.append(ToolMessage(f"[{item['id']}] {item['summary']}", tool_call_id=item["id"]))
    return messages


@dataclass
class Picked:
    """The calls a step makes and what the model said: its words, each call it asked for
    with the call it became or why it was refused, and who chose (a provider's name)."""

    calls: list[dict[str, Any]]
    text: str = ""
    asked: list[dict[str, Any]] = field(default_factory=list)
    by: str = "offline"


def _as_call(
    inv: Investigation,
    name: str,
    args: dict[str, Any],
    offered: list[dict[str, Any]],
    made: set[str],
    tools: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """The evidence call a model's tool call becomes (raises BadArguments when refused)."""
    if name not in EVIDENCE_ARGS:
        raise BadArguments(f"unknown tool {name!r}")
    if tools is not None and name not in tools:
        raise BadArguments(f"{name} is not among this agent's tools ({', '.join(tools)})")
    if name in READS:
        for call in offered:
            if call["tool"] == name:
                return call
        made_it = any(i.split("-", 1)[-1] == name for i in made)
        raise BadArguments(
            f"{name}: read already" if made_it else f"{name}: the bundle holds nothing to read"
        )
    parsed = checked(name, args)
    for call in offered:
        if call["tool"] == name and checked(name, call["args"]) == parsed:
            return call
    values = parsed.model_dump(mode="json")
    digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:8]
    call_id = f"ev-{name}-{values['service']}" if name == "topology" else f"ev-{name}-{digest}"
    if call_id in made:
        raise BadArguments(f"{name}: made already ({call_id})")
    if len(made) >= MAX_CALLS:
        raise BadArguments(f"{name}: {MAX_CALLS} calls made, no more beyond the playbook's")
    return {
        "call_id": call_id,
        "tool": name,
        "args": values,
        "position": 50 + len(made) + ORDER.get(name, 0),
    }


def pick_calls(
    inv: Investigation,
    ctx: AgentContext,
    run: AgentRun,
    evidence: list[dict[str, Any]],
    offered: list[dict[str, Any]],
    offline: list[dict[str, Any]],
    *,
    purpose: str,
    tools: tuple[str, ...] | None = None,
    role: str = "",
    offline_only: bool = False,
) -> Picked:
    """The calls the model asks for next (its tool calls, in its order), bounded as the
    module says; `offline` when no model reasons or every provider failed. No tool call:
    the model has read enough (an empty list). `tools`: the only tools it may use (a
    specialist's); `role`: whose choice it is (a specialist's); `offline_only`: the
    offline choice whatever is configured."""
    if offline_only or not model_reasons(ctx):
        return Picked(offline)
    made = {e["id"] for e in evidence}

    def call(provider: Provider) -> tuple[Picked, Usage]:
        if isinstance(provider, OfflineProvider):
            return Picked(offline), Usage()
        if not isinstance(provider, OpenAICompatibleProvider):
            raise ProviderError(
                f"{provider.name} cannot reason", retryable=False, error_class="other"
            )
        reply, usage = _ask(provider, conversation(inv, evidence, role), tool_schemas(tools))
        picked = Picked([], str(reply.content or ""), by=provider.name)
        for tool_call in reply.tool_calls:
            name, args = tool_call["name"], dict(tool_call.get("args") or {})
            try:
                chosen = _as_call(inv, name, args, offered, made, tools)
            except BadArguments as refused:
                picked.asked.append({"name": name, "args": args, "refused": str(refused)})
                continue
            if chosen["call_id"] not in {c["call_id"] for c in picked.calls}:
                picked.calls.append(chosen)
            picked.asked.append({"name": name, "args": args, "call": chosen["call_id"]})
        for bad in reply.invalid_tool_calls:
            picked.asked.append(
                {"name": bad.get("name") or "?", "refused": "arguments are not valid JSON"}
            )
        return picked, usage

    picked = call_with_fallback(
        ctx.providers,
        purpose,
        call,
        call_recorder(ctx, run),
        fallback_recorder(ctx, run),
        skip_recorder(ctx, run),
    )
    if picked.by != "offline" and picked.asked and not picked.calls:
        picked.calls = offline  # every call it asked for was refused: the playbook's next
    if picked.by != "offline":
        _note(ctx, run, purpose, picked.text, {"picked": picked.asked, "by": picked.by})
    return picked


def _ask(
    provider: OpenAICompatibleProvider,
    messages: list[BaseMessage],
    tools: list[dict[str, Any]] | None,
) -> tuple[AIMessage, Usage]:
    try:
        client = client_for(provider.config)
        reply = (client.bind_tools(tools) if tools else client).invoke(messages)
    except Exception as exc:
        raise classify(exc, [provider.config.api_key()]) from None
    assert isinstance(reply, AIMessage)
    usage = provider.usage(reply, messages, {"tools": tools})
    usage.text = str(reply.content or "")
    return reply, usage


def _note(ctx: AgentContext, run: AgentRun, purpose: str, text: str, extra: dict[str, Any]) -> None:
    """The model's words of a step, as an `agent.note` on the timeline (cut when runaway)."""
    words, cut_from = cut_generated(text, MAX_MODEL_TEXT)
    payload: dict[str, Any] = {"kind": "diagnosis_model", "step": purpose, "text": words, **extra}
    if cut_from is not None:
        payload["cut_from_chars"] = cut_from
    append_step_event(ctx.session_id, AGENT_NOTE, payload, producer=ctx.producer, run=run)
    # The budget counts these notes from the log: the step's group commits with it, so
    # the next step's check finds it (with waits on, the steps are grouped otherwise).
    step_group(ctx).end_after_step = True


# --- the conclusion's words -------------------------------------------------------------------


class ModelConclusion(BaseModel):
    """What the model is asked to conclude: a root cause and the ids it rests on."""

    hypothesis: str = Field(max_length=100)
    service: str | None = Field(default=None, max_length=100)
    summary: str = Field(default="", max_length=MAX_MODEL_TEXT)
    evidence: list[str] = Field(default_factory=list, max_length=100)


def _conclusion_request(found: dict[str, Any], playbook: Playbook, language: str) -> str:
    findings = [
        {"hypothesis": c["hypothesis"], "service": c["service"]} for c in found["candidates"]
    ]
    return (
        "Conclude now. Reply with JSON only: "
        '{"hypothesis": ..., "service": ..., "summary": ..., "evidence": [ids]}. '
        f"The hypotheses: {', '.join(sorted(playbook.hypotheses))}. "
        f"The findings so far: {json.dumps(findings)}. Cite the ids of the results your "
        "conclusion rests on; the summary is a few sentences for the reporter, in "
        + ("Chinese." if language == "zh" else "English.")
    )


def worded(
    inv: Investigation,
    ctx: AgentContext,
    run: AgentRun,
    evidence: list[dict[str, Any]],
    found: dict[str, Any],
    cited: list[str],
    language: str,
) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]]:
    """(the conclusion, the ids it cites, the violations): the model's words when it
    names the playbook's root cause and cites this session's results; else the
    playbook's `found` and `cited`, with each violation. No model: `found` as it is."""
    if not model_reasons(ctx):
        return found, cited, []
    playbook = inv.playbook

    def call(provider: Provider) -> tuple[tuple[ModelConclusion, str] | None, Usage]:
        if isinstance(provider, OfflineProvider):
            return None, Usage()
        if not isinstance(provider, OpenAICompatibleProvider):
            raise ProviderError(
                f"{provider.name} cannot conclude", retryable=False, error_class="other"
            )
        messages = [
            *conversation(inv, evidence),
            HumanMessage(_conclusion_request(found, playbook, language)),
        ]
        reply, usage = _ask(provider, messages, None)
        try:
            said = ModelConclusion.model_validate_json(_json_of(str(reply.content or "")))
        except ValidationError as exc:
            error = ProviderError(
                f"the conclusion is not the JSON asked for: {exc.errors()[0]['msg']}",
                retryable=True,
                error_class="bad_reply",
            )
            error.usage = usage  # the reply was paid for even if unusable
            raise error from None
        return (said, provider.name), usage

    answer = call_with_fallback(
        ctx.providers,
        "conclude",
        call,
        call_recorder(ctx, run),
        fallback_recorder(ctx, run),
        skip_recorder(ctx, run),
    )
    if answer is None:
        return found, cited, []
    said, by = answer
    _note(
        ctx,
        run,
        "conclude",
        said.summary,
        {"hypothesis": said.hypothesis, "service": said.service, "evidence": said.evidence},
    )
    return bounded(said, by, found, cited, citations.session_results(ctx.session_id), language)


def _json_of(text: str) -> str:
    """The JSON object in a reply (a model may fence it in Markdown)."""
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else text


def bounded(
    said: ModelConclusion,
    by: str,
    found: dict[str, Any],
    cited: list[str],
    results: set[str],
    language: str,
) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]]:
    """The model's conclusion checked against the playbook's (`found`, citing `cited`)
    and this session's tool results: its words kept when it names the playbook's root
    cause and cites a result of this session; else the playbook's, with the violation."""
    violations: list[dict[str, Any]] = []
    named = (said.hypothesis, said.service or None)
    first = (found["hypothesis"], found.get("service") or None)
    if named != first:
        among = any((c["hypothesis"], c["service"]) == named for c in found["candidates"])
        violations.append(
            {
                "kind": OUTRANKED if among else OUTSIDE,
                "hypothesis": said.hypothesis,
                "service": said.service or "",
                "playbook": {"hypothesis": first[0], "service": first[1] or ""},
                "violation": f"the model concluded {said.hypothesis} ({said.service or '-'}), "
                + (
                    "which the playbook's findings rank below "
                    if among
                    else "which is not among the playbook's findings; corrected to "
                )
                + f"{first[0]} ({first[1] or '-'})",
            }
        )
        return found, cited, violations
    foreign = [i for i in said.evidence if i not in results]
    kept = [i for i in dict.fromkeys(said.evidence) if i in results]
    if foreign:
        violations.append(
            {
                "kind": citations.FOREIGN,
                "ids": foreign,
                "violation": "the conclusion cited evidence that is not a tool result of "
                f"this session: {', '.join(foreign)}; dropped",
            }
        )
    if not set(kept) - {citations.INVENTORY} and found["hypothesis"] != "unknown":
        violations.append(
            {
                "kind": citations.UNCITED,
                "hypothesis": said.hypothesis,
                "service": said.service or "",
                "violation": f"the model's conclusion {said.hypothesis} ({said.service}) "
                "cited no tool result of this session; not reported: the playbook's "
                "conclusion, citing its calls, is recorded",
            }
        )
        return found, cited, violations
    text, _cut = cut_generated(said.summary, MAX_MODEL_TEXT)
    summary = {**found["summary"], language: text} if text else found["summary"]
    return {**found, "summary": summary, "worded_by": by}, kept, violations
