"""A diagnosis session's graph: intake -> evidence -> conclusion -> fix proposed ->
approval -> fix executed -> report, with an ask-the-reporter wait when the evidence names
no root cause.

Every step is recorded by the core (diagnosis.agent.recording): each evidence tool is an
R0 ToolCall with its start and result events, the conclusion is `finding.recorded`
events, the fix goes through the core's approval queue and outbox. The conclusion is
the offline playbook's (packs.diagnosis.playbook), pinned in the session's scenario
version; a model may word it later, never change it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any, Literal, TypedDict

from django.conf import settings
from langgraph.graph import END, START, StateGraph
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_incrementing

from diagnosis.agent.nodes.proposals import propose_action
from diagnosis.agent.nodes.waiting import ask_user, await_approval
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import ToolContext, run_action, run_recorded
from diagnosis.events import append_event_once, append_step_event
from diagnosis.models import AgentRun, Event, Session, ToolCall, ToolCallStatus
from diagnosis.reporting import write_report
from packs.diagnosis.bundle import Bundle, open_bundle
from packs.diagnosis.charts import downsample
from packs.diagnosis.code import CodeToolError, code
from packs.diagnosis.evidence import Evidence
from packs.diagnosis.fixes import fix_problems
from packs.diagnosis.knowledge import linked_cases, similar_cases_tool
from packs.diagnosis.names import SIMILAR
from packs.diagnosis.playbook import Diagnosis, Playbook, diagnose, minutes_between
from packs.diagnosis.storage import bundle_dir
from packs.diagnosis.system import System, demo_shop
from scenarios_admin.definition import effective_risk_class

# How many error signatures and anomalies a tool result keeps (the rest are counted).
MAX_LISTED = 20
FIX_CALL = "fix-1"
QUESTION_KEY = "q-evidence"
ASK = {
    "zh": "证据不足以确定根因（缺少：{missing}）。"
    "请补充您知道的情况：哪个服务、什么时候开始、最近有哪些变更？",
    "en": "The evidence names no root cause (missing: {missing}). Please add what you know: "
    "which service, since when, and any recent change?",
}


class DiagnosisState(TypedDict, total=False):
    """What the graph carries between steps (its checkpoint); the log is the history."""

    session_id: str
    language: str
    consumed_seq: int  # the last user.message seq read
    question: dict[str, Any] | None
    bundle: dict[str, Any]  # the read_bundle call's result
    evidence: dict[str, Any]  # {"calls": [{id, tool, summary, error}]}
    conclusion: dict[str, Any]  # the playbook's, as the findings record it
    answers: list[str]
    new_input: bool  # the core's approval wait sets it
    reported: bool


def build_graph() -> StateGraph[DiagnosisState, AgentContext, DiagnosisState, DiagnosisState]:
    builder = StateGraph(DiagnosisState, context_schema=AgentContext)
    # The core's recorded nodes are annotated with the airport's state: each node reads
    # this graph's state instead.
    nodes = (
        ("intake", intake),
        ("gather_evidence", gather_evidence),
        ("conclude", conclude),
        ("ask_user", ask_user),
        ("read_answer", read_answer),
        ("propose_fix", propose_fix),
        ("await_approval", await_approval),
        ("execute_fix", execute_fix),
        ("report", report),
    )
    for name, node in nodes:
        builder.add_node(name, node, input_schema=DiagnosisState)  # type: ignore[misc]
    builder.add_edge(START, "intake")
    builder.add_edge("intake", "gather_evidence")
    builder.add_edge("gather_evidence", "conclude")
    builder.add_conditional_edges("conclude", route_after_conclusion)
    builder.add_edge("ask_user", "read_answer")
    builder.add_edge("read_answer", "report")
    builder.add_edge("propose_fix", "await_approval")
    builder.add_edge("await_approval", "execute_fix")
    builder.add_conditional_edges("execute_fix", route_after_execution)
    builder.add_edge("report", END)
    return builder


def initial_state(session: Any, definition: dict[str, Any]) -> dict[str, Any]:
    return {"session_id": str(session.pk), "language": session.language, "consumed_seq": 0}


@contextmanager
def session_bundle(session_id: Any) -> Iterator[Bundle]:
    """The bundle stored with the session (checked again: it is read from disk)."""
    bundle = open_bundle(bundle_dir(session_id))
    try:
        yield bundle
    finally:
        bundle.close()


def _tctx(ctx: AgentContext, run: AgentRun) -> ToolContext:
    return ToolContext(ctx.session_id, ctx.graph, run, ctx.producer, definition=ctx.definition)


def _system(ctx: AgentContext) -> System:
    return ctx.graph if isinstance(ctx.graph, System) else demo_shop()


def _playbook(ctx: AgentContext) -> Playbook:
    return Playbook.model_validate(ctx.definition["playbook"])


# --- intake ------------------------------------------------------------------------------


@recorded("intake")
def intake(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    def read() -> dict[str, Any]:
        with session_bundle(ctx.session_id) as bundle:
            incident = bundle.incident
            sources = bundle.sources
            return {
                "incident": {
                    "id": incident.id,
                    "title": incident.title,
                    "description": incident.description,
                    "reported_at": incident.reported_at.isoformat(),
                    "problem_type": incident.problem_type,
                    "services": list(incident.services),
                    "preferred_mode": incident.preferred_mode or "",
                },
                "sources": sources,
                "log_lines": bundle.log_lines,
                "metric_rows": bundle.metric_rows,
                "deploys": len(bundle.deploys),
                "config_changes": len(bundle.config_changes),
                "summary": _sources_words(sources, bundle.log_lines, bundle.metric_rows),
            }

    result, error = run_recorded(
        _tctx(ctx, run), {"call_id": "ev-bundle", "tool": "read_bundle", "args": {}}, read
    )
    if error:
        raise RuntimeError(f"the session's bundle cannot be read: {error}")
    # The reporter's opening words are the bundle's description: read with it, so only a
    # later message answers a question.
    opening = (
        Event.objects.filter(session_id=ctx.session_id, type="user.message")
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    requested = (
        Event.objects.filter(session_id=ctx.session_id, type="diagnosis.requested")
        .values_list("payload", flat=True)
        .first()
    ) or {}
    result = {**result, "problem_type": requested.get("problem_type", "")}
    return {"bundle": result, "consumed_seq": opening or 0, "_summary": result["summary"]}


def _sources_words(sources: dict[str, bool], log_lines: int, metric_rows: int) -> str:
    held = [name for name, present in sources.items() if present]
    lacking = [name for name, present in sources.items() if not present]
    words = f"{log_lines} log lines, {metric_rows} metric samples; sources: {', '.join(held)}"
    return words + (f"; lacking: {', '.join(lacking)}" if lacking else "")


# --- evidence ------------------------------------------------------------------------------


@recorded("gather_evidence")
def gather_evidence(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The evidence tools, each an R0 call with its result summary, then the playbook's
    reading of them (computed here from the same bundle, kept for the next step)."""
    tctx = _tctx(ctx, run)
    system = _system(ctx)
    playbook = _playbook(ctx)
    bundle_read = state["bundle"]
    evidence: list[dict[str, Any]] = [
        {"id": "ev-bundle", "tool": "read_bundle", "summary": bundle_read["summary"], "error": ""}
    ]

    def call(call_id: str, tool: str, args: dict[str, Any], compute: Any) -> dict[str, Any]:
        response, error = run_recorded(
            tctx,
            {"call_id": call_id, "tool": tool, "args": args, "position": len(evidence) + 1},
            compute,
        )
        summary = response.get("summary", "") if not error else f"failed: {error}"
        evidence.append({"id": call_id, "tool": tool, "summary": summary, "error": error})
        return response

    with session_bundle(ctx.session_id) as bundle:
        chosen = state["bundle"].get("problem_type") or ""
        if chosen in playbook.problem_types:  # the reporter's choice on the form
            bundle.incident = bundle.incident.model_copy(update={"problem_type": chosen})
        found = diagnose(bundle, system, playbook)
        since, until = found.window
        window = {"since": since.isoformat(), "until": until.isoformat()}
        source = Evidence(bundle)
        try:
            if bundle.has_logs:
                call(
                    "ev-log_signatures",
                    "log_signatures",
                    window,
                    lambda: _signatures(source, found),
                )
            if bundle.has_metrics:
                call("ev-anomalies", "anomalies", window, lambda: _anomalies(source, found))
            if bundle.deploys:
                call("ev-deploys", "deploys", window, lambda: _changes(bundle.deploys, "deploys"))
            if bundle.config_changes:
                call(
                    "ev-config_changes",
                    "config_changes",
                    window,
                    lambda: _changes(bundle.config_changes, "config changes"),
                )
        finally:
            source.close()
        for service in found.candidates:
            call(
                f"ev-topology-{service}",
                "topology",
                {"service": service},
                lambda service=service: _topology(system, service),
            )
        # The past cases like this one, searched with the incident's words, what the new
        # errors at or towards the suspects say, and the services in play (the suspects
        # first); the links are stored and logged once (a re-run reuses them).
        incident = bundle_read["incident"]
        suspects = found.candidates
        errors = dict.fromkeys(
            s.template
            for s in found.new_signatures
            if s.service in suspects or s.upstream in suspects
        )
        asked = {
            "text": "\n".join(
                t for t in (incident["title"], incident["description"], *list(errors)[:3]) if t
            ),
            "services": list(
                dict.fromkeys([*suspects, *incident["services"], *found.related_services])
            ),
        }
        similar = call(
            "ev-similar_cases",
            "similar_cases",
            asked,
            lambda: similar_cases_tool(ctx.session_id, asked),
        )
        if "cases" in similar:
            append_step_event(
                ctx.session_id, SIMILAR, {"cases": similar["cases"]}, producer=ctx.producer, run=run
            )
        for index, location in enumerate(found.code_locations, start=1):
            call(
                f"ev-code-{index}",
                "code",
                {"commit": location.commit, "path": location.path, "line": location.line},
                lambda location=location: _code(bundle, location),
            )
    return {
        "evidence": {"calls": evidence},
        "conclusion": _conclusion(found, system),
        "_summary": f"{len(evidence)} evidence calls",
    }


def _signatures(source: Evidence, found: Diagnosis) -> dict[str, Any]:
    since, until = found.window
    every = source.log_signatures(since=since, until=until)
    new = {(s.service, s.template) for s in found.new_signatures}
    listed = [{**s.as_dict(), "new": (s.service, s.template) in new} for s in every[:MAX_LISTED]]
    newest = found.new_signatures[:3]
    words = "; ".join(f"{s.service} x{s.count} {s.sample[:80]}" for s in newest)
    return {
        "signatures": listed,
        "total": len(every),
        "new": len(new),
        "summary": f"{len(every)} error signatures, {len(new)} new"
        + (f": {words}" if words else ""),
    }


def _anomalies(source: Evidence, found: Diagnosis) -> dict[str, Any]:
    """Each anomaly with its series over the window (downsampled), for the page's chart:
    the picture comes from the log, as the rest of the evidence does."""
    since, until = found.window
    listed = found.anomalies[:MAX_LISTED]
    metrics = sorted({a.metric for a in listed if a.metric != "log_errors_per_minute"})
    samples = source.series(metrics, since=since, until=until) if metrics else {}
    quiet = sorted({a.service for a in listed if a.metric == "log_errors_per_minute"})
    per_minute = source.errors_per_minute(quiet, since, until)
    minutes = minutes_between(since, until)
    rows: list[dict[str, Any]] = []
    for a in found.anomalies:
        row: dict[str, Any] = {
            "service": a.service,
            "metric": a.metric,
            "onset": a.onset.isoformat(),
            "baseline": a.baseline,
            "peak": a.peak,
        }
        if len(rows) < MAX_LISTED:
            if a.metric == "log_errors_per_minute":
                counts = per_minute.get(a.service, {})
                series = [(m, float(counts.get(m, 0))) for m in minutes]
            else:
                series = samples.get((a.service, a.metric), [])
            row["series"] = downsample(series)
        rows.append(row)
    words = "; ".join(f"{a['service']} {a['metric']} from {a['onset']}" for a in rows[:3])
    return {
        "anomalies": rows[:MAX_LISTED],
        "t0": found.t0.isoformat(),
        "summary": f"{len(rows)} metric anomalies" + (f": {words}" if words else ""),
    }


def _changes(changes: list[Any], what: str) -> dict[str, Any]:
    rows = [c.model_dump(mode="json") for c in changes]
    words = "; ".join(
        f"{c['id']} {c['service']} {c.get('version') or c.get('key') or ''} at {c['at']}"
        for c in rows[:3]
    )
    return {"changes": rows[:MAX_LISTED], "summary": f"{len(rows)} {what}: {words}"}


def _topology(system: System, service: str) -> dict[str, Any]:
    found = system.topology(service)
    return {
        **found,
        "kind": system.kind(service),
        "summary": f"{service} ({system.kind(service)}): called by "
        f"{', '.join(found['callers']) or 'none'}; depends on "
        f"{', '.join(found['depends_on']) or 'none'}",
    }


def _code(bundle: Bundle, location: Any) -> dict[str, Any]:
    """The code tool through MCP, retried per the tools' policy (AERO_TOOL_RETRIES, linear
    AERO_TOOL_BACKOFF) when its server crashed, hung or refused; after the last attempt
    the call fails (recorded) and the diagnosis goes on without it."""
    if not bundle.has_repo:
        raise CodeToolError("the bundle has no repo/")
    retrying = Retrying(
        retry=retry_if_exception_type(CodeToolError),
        stop=stop_after_attempt(settings.AERO_TOOL_RETRIES + 1),
        wait=wait_incrementing(
            start=settings.AERO_TOOL_BACKOFF, increment=settings.AERO_TOOL_BACKOFF
        ),
        reraise=True,
    )
    looked = retrying(
        code,
        bundle.root / "repo",
        commit=location.commit,
        path=location.path,
        line=location.line,
    )
    return {
        "commit": looked.commit,
        "path": looked.path,
        "line": looked.line,
        "hunk": looked.hunk,
        "excerpt": [[n, text] for n, text in looked.excerpt],
        "summary": f"{looked.path}:{looked.line} changed by {looked.commit[:10]}",
    }


def _conclusion(found: Diagnosis, system: System) -> dict[str, Any]:
    action = found.action
    return {
        "hypothesis": found.hypothesis,
        "service": found.service,
        "service_kind": system.kind(found.service) if found.service else "",
        "deploy": found.deploy,
        "config_key": found.config_key,
        "summary": found.summary,
        "confidence": found.confidence,
        "problem_type": found.problem_type,
        "related_services": found.related_services,
        "code_locations": [asdict(c) for c in found.code_locations],
        "candidates": [
            {
                "hypothesis": f.hypothesis,
                "service": f.service,
                "rank": f.rank,
                "conditions": list(f.conditions),
            }
            for f in found.findings
        ],
        "missing": found.missing,
        "t0": found.t0.isoformat(),
        "window": [found.window[0].isoformat(), found.window[1].isoformat()],
        "action": action,
    }


# --- conclusion ------------------------------------------------------------------------------


@recorded("conclude")
def conclude(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The playbook's findings and its conclusion as `finding.recorded` events, each
    citing the evidence calls it rests on."""
    found: dict[str, Any] = state["conclusion"]
    # The past cases are shown beside the conclusion; the playbook does not read them.
    cited = [
        e["id"]
        for e in state["evidence"]["calls"]
        if not e.get("error") and e["tool"] != "similar_cases"
    ]
    for candidate in found["candidates"]:
        append_step_event(
            ctx.session_id,
            "finding.recorded",
            {"kind": "hypothesis", **candidate},
            producer=ctx.producer,
            run=run,
        )
    append_step_event(
        ctx.session_id,
        "finding.recorded",
        {
            "kind": "root_cause",
            **{k: v for k, v in found.items() if k not in ("candidates", "action")},
            "fix": found["action"],
            "evidence": cited,
        },
        producer=ctx.producer,
        run=run,
    )
    update: dict[str, Any] = {"_summary": f"root cause: {found['hypothesis']}"}
    if found["hypothesis"] == "unknown":
        lang = "zh" if state.get("language") == "zh" else "en"
        text = ASK[lang].format(missing=", ".join(found["missing"]) or "-")
        append_event_once(
            ctx.session_id,
            "agent.question",
            QUESTION_KEY,
            {"field": "description", "label": "", "text": text},
            producer=ctx.producer,
            run=run,
        )
        update["question"] = {"field": "description", "text": text, "key": QUESTION_KEY}
    return update


def route_after_conclusion(state: DiagnosisState) -> Literal["ask_user", "propose_fix", "report"]:
    found: dict[str, Any] = state["conclusion"]
    if found["hypothesis"] == "unknown":
        return "ask_user"
    return "propose_fix" if found.get("action") else "report"


@recorded("read_answer")
def read_answer(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The reporter's answer to the evidence question: kept in the log (it is the
    user.message) and read into the report; it adds no evidence the playbook could use."""
    answers = list(
        Event.objects.filter(
            session_id=ctx.session_id, type="user.message", seq__gt=state.get("consumed_seq", 0)
        )
        .order_by("seq")
        .values_list("seq", "payload")
    )
    if not answers:
        return {"_summary": "no answer"}
    return {
        "consumed_seq": answers[-1][0],
        "answers": [str(p.get("text", "")) for _, p in answers],
        "question": None,
        "_summary": "answer read",
    }


# --- fixes -----------------------------------------------------------------------------------


@recorded("propose_fix")
def propose_fix(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The playbook's fix, under the pack's policy, through the core's approvals."""
    found: dict[str, Any] = state["conclusion"]
    action = found["action"]
    risk_class = effective_risk_class(action["tool"], action["risk_class"])
    problems = fix_problems(action["tool"], action["args"], risk_class, found, _system(ctx))
    if problems:
        # The playbook never proposes such a fix; a definition edited into one is refused.
        append_step_event(
            ctx.session_id,
            "agent.note",
            {"text": "fix not proposed: " + "; ".join(problems)},
            producer=ctx.producer,
            run=run,
        )
        return {"_summary": "fix refused by the policy"}
    call = {
        "call_id": FIX_CALL,
        "tool": action["tool"],
        "args": action["args"],
        "risk_class": risk_class,
        "is_action": True,
        "position": 1,
    }
    made = ToolCall.objects.filter(session_id=ctx.session_id, call_id=FIX_CALL).exists()
    propose_action(_tctx(ctx, run), call, fresh=not made)
    ctx.actions = None
    return {"_commit": True, "_summary": f"proposed {action['tool']} ({risk_class})"}


@recorded("execute_fix")
def execute_fix(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """An approved fix goes out through the outbox (its row was written with the
    decision); a message sent while the approval waited is read, not acted on."""
    update: dict[str, Any] = {"_commit": True}
    latest = (
        Event.objects.filter(
            session_id=ctx.session_id, type="user.message", seq__gt=state.get("consumed_seq", 0)
        )
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    if latest is not None:
        update["consumed_seq"] = latest
    tctx = _tctx(ctx, run)
    executed = 0
    for tool_call in ToolCall.objects.filter(
        session_id=ctx.session_id,
        is_action=True,
        status__in=(ToolCallStatus.APPROVED, ToolCallStatus.EXECUTING, ToolCallStatus.RUNNING),
    ):
        run_action(tctx, tool_call.pk)
        executed += 1
    ctx.actions = None
    update["_summary"] = f"{executed} fixes sent"
    return update


def route_after_execution(state: DiagnosisState) -> Literal["await_approval", "report"]:
    waiting = ToolCall.objects.filter(
        session_id=state["session_id"],
        is_action=True,
        status=ToolCallStatus.AWAITING_APPROVAL,
    ).exists()
    return "await_approval" if waiting else "report"


# --- report ----------------------------------------------------------------------------------


@recorded("report", last=True)
def report(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    found: dict[str, Any] = state["conclusion"]
    lang = "zh" if state.get("language") == "zh" else "en"
    playbook = _playbook(ctx)
    incident = state["bundle"]["incident"]
    labels: dict[str, str] = {
        str(k): v for k, v in playbook.problem_types.get(found["problem_type"], {}).items()
    }
    extra = {
        "incident": {**incident, "title": incident.get("title") or incident["description"][:80]},
        "diagnosis": {
            **found,
            "summary": found["summary"].get(lang, ""),
            "problem_type_label": labels.get(lang, found["problem_type"]),
        },
        "evidence": state["evidence"]["calls"],
        "answers": state.get("answers", []),
        # the three best past cases, as the conclusion's step linked them
        "similar": linked_cases(Session.objects.get(pk=ctx.session_id)),
    }
    write_report(
        ctx.session_id, ctx.definition, dict(state), producer=ctx.producer, run=run, extra=extra
    )
    return {"reported": True, "_summary": "report written"}
