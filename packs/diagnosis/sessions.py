"""Diagnosis sessions: opened from an incident bundle (a folder or an archive, checked
before anything is created), and their result as DIAGNOSIS.md §6's JSON."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from diagnosis.actions import ActionError, do_create_session
from diagnosis.agent_tree import machine_rows, read_tree
from diagnosis.eventlog.registry import EventType, Payload
from diagnosis.events import append_event
from diagnosis.models import Event, Session, ToolCall
from diagnosis.reporting import decision_of
from packs.diagnosis.bundle import BundleError, open_bundle
from packs.diagnosis.knowledge import KEPT, linked_cases
from packs.diagnosis.models import MetricsSource, SystemSources
from packs.diagnosis.names import REQUESTED, SAVED, SIMILAR
from packs.diagnosis.report import report_fields
from packs.diagnosis.storage import delete_bundle, store_bundle
from packs.diagnosis.system import demo_shop
from scenarios_admin.models import Scenario

KIND = "diagnosis"
# The evidence tools a session runs, in its words (the core's timeline reads them).
EVIDENCE_LABELS: dict[str, Promise] = {
    "read_bundle": gettext_lazy("Read the incident bundle"),
    "log_signatures": gettext_lazy("Error signatures in the logs"),
    "anomalies": gettext_lazy("Metric anomalies"),
    "deploys": gettext_lazy("Deploys"),
    "config_changes": gettext_lazy("Config changes"),
    "commits": gettext_lazy("Recent commits (MCP git)"),
    "topology": gettext_lazy("Service topology"),
    "code": gettext_lazy("Read the code (MCP git)"),
    "similar_cases": gettext_lazy("Similar past cases"),
    "log_search": gettext_lazy("Log lines"),
    "metric_query": gettext_lazy("Metric series"),
}
# The agents of a session's tree in the command's JSON: each job's root run, a
# hierarchical run's orchestrator and its specialists (not every step's run).
AGENT_RUNS = ("orchestrate",)


def diagnosis_scenario() -> Scenario:
    scenario = (
        Scenario.objects.filter(kind=KIND, is_active=True, versions__isnull=False)
        .order_by("slug")
        .first()
    )
    if scenario is None:
        raise ActionError(
            _("No IT diagnosis scenario is published: run `manage.py load_builtin` first.")
        )
    return scenario


def start_from_bundle(user: Any, source: Any, options: dict[str, Any]) -> Session:
    """Check the bundle, then create the session with its bundle stored and queue it.
    A bad bundle raises ActionError naming its file, line and field; nothing is created.
    `options`: description (overrides the bundle's), title, producer. No bundle at all
    (`source` None): the system's sources alone (`sources=system`), the incident made
    of the description and the times given (`reported_at`, `since`, `until`)."""
    scratch: Path | None = None
    if source is None:
        scratch = Path(tempfile.mkdtemp(prefix="aero-nobundle-"))
        source = _incident_only(scratch, options)
    try:
        bundle = open_bundle(Path(source))
    except BundleError as exc:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise ActionError(_("The bundle is not valid: %(error)s") % {"error": exc}) from exc
    try:
        scenario = diagnosis_scenario()
        chosen = options.get("problem_type") or ""
        latest = scenario.latest_version()
        known = (latest.definition.get("playbook") or {}).get("problem_types", {}) if latest else {}
        if chosen and chosen not in known:
            raise ActionError(
                _("Unknown problem type %(type)s (known: %(known)s).")
                % {"type": chosen, "known": ", ".join(sorted(known))}
            )
        attached = _system_sources(
            options.get("sources") or "bundle", options.get("metrics_source") or ""
        )
        metrics = _metrics_choice(
            attached.metrics.name
            if attached is not None and attached.metrics is not None
            else options.get("metrics_source") or "",
            bundle.has_metrics,
        )
        evidence_from = _evidence_from(attached, bundle.has_logs)
        incident = bundle.incident
        text = (options.get("description") or "").strip() or incident.description
        title = (options.get("title") or "").strip() or incident.title
        stored: list[Any] = []

        def attach(session: Session) -> None:
            stored.append(session.pk)
            store_bundle(session.pk, bundle.root)
            append_event(
                session.pk,
                REQUESTED,
                {
                    "source": Path(source).name if scratch is None else "",
                    "problem_type": options.get("problem_type") or "",
                    "preferred_mode": options.get("preferred_mode") or "",
                    "sources": {**bundle.sources, "metrics": metrics["source"] != "none"},
                    # Where the metrics are read from (the bundle's file or a configured
                    # Prometheus): the page and the investigation read it here.
                    "metrics": metrics,
                    # The bundle's sources, or the system's as an admin attached them
                    # (logs stay the bundle's): the code tool reads its `code` here.
                    "evidence_from": evidence_from,
                    "log_lines": bundle.log_lines,
                    "metric_rows": bundle.metric_rows,
                },
                producer=options.get("producer", "web"),
            )

        try:
            return do_create_session(
                user,
                scenario,
                text,
                producer=options.get("producer", "web"),
                title=title,
                attach=attach,
            )
        except BaseException:
            for session_id in stored:  # the transaction rolled back: so does the copy
                delete_bundle(session_id)
            raise
    finally:
        bundle.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _incident_only(folder: Path, options: dict[str, Any]) -> Path:
    """A bundle of the incident alone (incident.yaml): a session on the system's sources
    without a bundle. Refused unless the system's sources were chosen and a description
    given."""
    if (options.get("sources") or "bundle") != "system":
        raise ActionError(_("Upload a bundle, or choose the system's sources."))
    description = (options.get("description") or "").strip()
    if not description:
        raise ActionError(_("Without a bundle, describe the incident."))
    until = options.get("until") or options.get("reported_at") or timezone.now().isoformat()
    incident: dict[str, Any] = {
        "description": description,
        "reported_at": options.get("reported_at") or until,
        "title": (options.get("title") or "").strip(),
    }
    if options.get("since"):
        incident["window"] = {"start": options["since"], "end": until}
    root = folder / "incident"
    root.mkdir()
    (root / "incident.yaml").write_text(yaml.safe_dump(incident, allow_unicode=True))
    return root


def _system_sources(choice: str, metrics_name: str) -> SystemSources | None:
    """The sources attached to the session's system when it reads them, else None (the
    bundle's). Refused before anything is created: a system with none attached, or
    both a metrics source and the system's sources asked for."""
    if choice == "bundle":
        return None
    if choice != "system":
        raise ActionError(
            _("Sources come from the bundle or the system, not %(x)s.") % {"x": choice}
        )
    if metrics_name:
        raise ActionError(_("Choose a metrics source or the system's sources, not both."))
    system = demo_shop().slug  # the pack's one system (its world)
    row = (
        SystemSources.objects.filter(system=system).select_related("metrics", "code_server").first()
    )
    if row is None:
        raise ActionError(
            _("No sources are attached to the system %(system)s.") % {"system": system}
        )
    return row


def _evidence_from(row: SystemSources | None, has_logs: bool) -> dict[str, Any]:
    if row is None:
        return {"sources": "bundle"}
    code = (
        {"server": row.code_server.name, "repo": row.repo_path}
        if row.code_server is not None
        else {}
    )
    # Logs stay the bundle's: none without one.
    logs = "bundle" if has_logs else "none"
    return {"sources": "system", "system": row.system, "code": code, "logs": logs}


def _metrics_choice(name: str, in_bundle: bool) -> dict[str, str]:
    """The metrics source a new session reads: an enabled configured one by name, else
    the bundle's metrics.csv (or none). An unknown name is refused before anything."""
    if not name:
        return {"source": "bundle" if in_bundle else "none", "name": "", "base_url": ""}
    row = MetricsSource.objects.filter(name=name, enabled=True).first()
    if row is None:
        known = MetricsSource.objects.filter(enabled=True).values_list("name", flat=True)
        raise ActionError(
            _("Unknown metrics source %(name)s (enabled: %(known)s).")
            % {"name": name, "known": ", ".join(known) or "-"}
        )
    return {"source": "prometheus", "name": row.name, "base_url": row.base_url}


def summarize(session: Session) -> dict[str, Any]:
    """DIAGNOSIS.md §6: one JSON object for `incident run --bundle --json`."""
    snapshot = session.snapshot or {}
    cause = snapshot.get("root_cause") or {}
    run_mode: dict[str, Any] = snapshot.get("run_mode") or {}
    lang = "zh" if session.language == "zh" else "en"
    calls = list(ToolCall.objects.filter(session=session).order_by("id"))
    evidence = [
        {
            "id": c.call_id,
            "tool": c.tool_name,
            "summary": (c.response_payload or {}).get("summary", "") or c.error,
        }
        for c in calls
        if c.call_id.startswith("ev-")
    ]
    fields = report_fields(session)
    requested = (
        Event.objects.filter(session=session, type=REQUESTED).values_list("payload", flat=True)
    ).first() or {}
    return {
        "session": str(session.pk),
        "status": session.status,
        "kind": KIND,
        "problem_type": cause.get("problem_type", ""),
        # The mode chosen (diagnosis.mode_chosen) and, after a switch, the one it ran in.
        "mode": run_mode.get("mode", ""),
        "mode_source": run_mode.get("source", ""),
        "mode_switched_to": run_mode.get("now", ""),
        "preferred_mode": requested.get("preferred_mode", ""),
        # Where the metrics were read from, and the sources the conclusion lacked.
        "metrics": requested.get("metrics") or {},
        # The bundle's sources or the system's as an admin attached them.
        "sources_from": requested.get("evidence_from") or {"sources": "bundle"},
        "missing_sources": cause.get("missing", []),
        "root_cause": {
            "hypothesis": cause.get("hypothesis"),
            "service": cause.get("service"),
            "deploy": cause.get("deploy"),
            "config_key": cause.get("config_key"),
            "summary": (cause.get("summary") or {}).get(lang, ""),
        }
        if cause
        else None,
        "confidence": cause.get("confidence"),
        "related_services": cause.get("related_services", []),
        "code_locations": [
            {"path": loc["path"], "line": loc["line"]} for loc in cause.get("code_locations", [])
        ],
        "similar_cases": [
            {"id": c["id"], "score": c["score"], "strategy": c["strategy"]}
            for c in linked_cases(session, limit=KEPT)
        ],
        "actions": [
            {
                "tool": c.tool_name,
                "args": c.request_payload,
                "risk_class": c.risk_class,
                "decision": decision_of(c),
                "status": c.status,
            }
            for c in calls
            if c.is_action
        ],
        # The agents (a job's run, the orchestrator, its specialists), not the steps of
        # the graph, depth first as the tree reads them.
        "agent_tree": [
            row
            for row in machine_rows(read_tree(session.pk))
            if row["parent"] is None
            or row["agent"] in AGENT_RUNS
            or str(row["agent"]).startswith("specialist_")
        ],
        "evidence": evidence,
        "question": (snapshot.get("question") or {}).get("text"),
        "tokens": session.tokens_in + session.tokens_out,
        # Seed 003's report fields (related_services and code_locations are above).
        **{key: fields[key] for key in ("root_cause_md", "fix_suggestion_md", "confidence_score")},
    }


class DiagnosisRequested(Payload):
    source: str
    problem_type: str = ""
    preferred_mode: str = ""
    sources: dict[str, bool] = {}
    # {"source": "bundle" | "prometheus" | "none", "name": ..., "base_url": ...}
    metrics: dict[str, str] = {}
    log_lines: int = 0
    metric_rows: int = 0


def _requested_words(p: dict[str, Any]) -> str:
    if not p.get("source"):  # no bundle: the system's sources alone
        return _("diagnosis requested on the system's sources, without a bundle")
    return _("diagnosis requested from %(source)s") % {"source": p.get("source", "")}


class SimilarCasePayload(Payload):
    id: str  # the knowledge item's key, e.g. KB-003
    score: float
    strategy: str


class SimilarCasesFound(Payload):
    cases: list[SimilarCasePayload] = []


class KnowledgeSaved(Payload):
    id: str
    item: int
    by: str


def _similar_words(p: dict[str, Any]) -> str:
    cases = p.get("cases") or []
    if not cases:
        return _("no similar past cases found")
    return _("similar past cases: %(cases)s") % {
        "cases": ", ".join(f"{c.get('id')} ({c.get('score')})" for c in cases)
    }


def _saved_words(p: dict[str, Any]) -> str:
    return _("saved to the knowledge base as %(id)s by %(by)s") % {
        "id": p.get("id", ""),
        "by": p.get("by", ""),
    }


# The pack's panel stands where the facts panel is: it re-renders with it.
PANEL = frozenset({"session-facts"})

EVENT_TYPES = (
    EventType(
        REQUESTED,
        DiagnosisRequested,
        summary=_requested_words,
        line="diagnosis_pack/_lines.html#requested",
    ),
    EventType(
        SIMILAR,
        SimilarCasesFound,
        summary=_similar_words,
        line="diagnosis_pack/_lines.html#similar-cases",
        panels=PANEL,
    ),
    EventType(
        SAVED,
        KnowledgeSaved,
        summary=_saved_words,
        line="diagnosis_pack/_lines.html#knowledge-saved",
        panels=PANEL,
    ),
)
