"""A diagnosis session's first step: the bundle read (its sources, the incident) and the
run mode chosen (the reporter's, else the routing matrix's, else the pack's default)."""

from __future__ import annotations

from typing import Any

from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.agent.tools import run_recorded
from diagnosis.eventlog.names import USER_MESSAGE
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun, Event
from packs.diagnosis.modes import MODE_CHOSEN, choose_mode
from packs.diagnosis.names import REQUESTED
from packs.diagnosis.steps import (
    DiagnosisState,
    playbook_of,
    session_bundle,
    set_mode,
    tool_context,
)


@recorded("intake")
def intake(state: DiagnosisState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    requested = (
        Event.objects.filter(session_id=ctx.session_id, type=REQUESTED)
        .values_list("payload", flat=True)
        .first()
    ) or {}
    # Where the metrics come from: the bundle's file or a configured Prometheus.
    metrics = requested.get("metrics") or {}

    def read() -> dict[str, Any]:
        with session_bundle(ctx.session_id) as bundle:
            incident = bundle.incident
            sources = bundle.sources
            live = metrics.get("source") == "prometheus"
            if live:
                sources = {**sources, "metrics": True}
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
                "metrics_from": metrics,
                # The bundle's sources or the system's (its code source), as requested.
                "evidence_from": requested.get("evidence_from") or {"sources": "bundle"},
                "summary": _sources_words(sources, bundle.log_lines, bundle.metric_rows)
                + (
                    f"; metrics from Prometheus {metrics.get('name')} ({metrics.get('base_url')})"
                    if live
                    else ""
                ),
            }

    result, error = run_recorded(
        tool_context(ctx, run), {"call_id": "ev-bundle", "tool": "read_bundle", "args": {}}, read
    )
    if error:
        raise RuntimeError(f"the session's bundle cannot be read: {error}")
    # The reporter's opening words are the bundle's description: read with it, so only a
    # later message answers a question.
    opening = (
        Event.objects.filter(session_id=ctx.session_id, type=USER_MESSAGE)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    )
    result = {**result, "problem_type": requested.get("problem_type", "")}
    # The run mode: the reporter's preferred one (the request's, else the bundle's), else
    # the routing matrix's for the stated problem type, else the pack's default.
    stated = result["problem_type"] or result["incident"]["problem_type"] or ""
    preferred = requested.get("preferred_mode", "")
    mode, source = choose_mode(
        preferred, result["incident"]["preferred_mode"], stated, playbook_of(ctx).modes
    )
    append_step_event(
        ctx.session_id,
        MODE_CHOSEN,
        {
            "mode": mode,
            "source": source,
            "problem_type": stated,
            "preferred": preferred or result["incident"]["preferred_mode"],
        },
        producer=ctx.producer,
        run=run,
    )
    set_mode(ctx.root_run, mode)
    evidence = [
        {"id": "ev-bundle", "tool": "read_bundle", "summary": result["summary"], "error": ""}
    ]
    return {
        "bundle": result,
        "consumed_seq": opening or 0,
        "mode": mode,
        "evidence": {"calls": evidence},
        "_summary": result["summary"],
    }


def _sources_words(sources: dict[str, bool], log_lines: int, metric_rows: int) -> str:
    held = [name for name, present in sources.items() if present]
    lacking = [name for name, present in sources.items() if not present]
    words = f"{log_lines} log lines, {metric_rows} metric samples; sources: {', '.join(held)}"
    return words + (f"; lacking: {', '.join(lacking)}" if lacking else "")
