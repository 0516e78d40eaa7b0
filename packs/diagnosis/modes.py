"""Run modes (DIAGNOSIS.md §4, seed 003 §5.2): which mode a session runs in and why, and
the events that say so: the choice, a plan shown before it runs, each specialist's
report, the orchestrator's aggregation, and a switch from one mode to another with its
reason. The modes themselves are the graph's (packs.diagnosis.graph)."""

from __future__ import annotations

from typing import Any

from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from pydantic import Field

from diagnosis.eventlog.registry import EventType, Payload
from packs.diagnosis.playbook_data import RUN_MODES, RunModes

MODE_CHOSEN = "diagnosis.mode_chosen"
PLAN = "diagnosis.plan"
SPECIALIST_REPORTED = "diagnosis.specialist_reported"
AGGREGATED = "diagnosis.evidence_aggregated"
MODE_SWITCHED = "diagnosis.mode_switched"

MODE_LABELS = {
    "react": gettext_lazy("ReAct"),
    "plan_execute": gettext_lazy("Plan and execute"),
    "hierarchical": gettext_lazy("Hierarchical"),
    # where a degraded hierarchical run ends: metrics and changes only
    "minimal": gettext_lazy("Minimal path"),
}
SOURCE_LABELS = {
    "preferred": gettext_lazy("the reporter's choice"),
    "routing": gettext_lazy("the routing matrix"),
    "default": gettext_lazy("the default"),
}
# The specialists of a hierarchical run, in the order their evidence is aggregated.
SPECIALISTS = ("logs", "metrics", "changes_code", "knowledge")
# The child agents' kind the pack registers (apps.py): a specialist.
SPECIALIST_KIND = "diagnosis_specialist"
SPECIALIST_LABELS = {
    "logs": gettext_lazy("Logs"),
    "metrics": gettext_lazy("Metrics"),
    "changes_code": gettext_lazy("Changes and code"),
    "knowledge": gettext_lazy("Knowledge"),
}

# The graph's steps as agent runs (AgentRun.agent_name) in words: replay's run tree and the
# session page's agent tree show these, the name in a tooltip (registered in apps.py).
STEP_LABELS: dict[str, Promise] = {
    "intake": gettext_lazy("reading the report"),
    "react_step": gettext_lazy("investigating"),
    "plan": gettext_lazy("planning"),
    "execute": gettext_lazy("carrying out the plan"),
    "orchestrate": gettext_lazy("orchestrating the specialists"),
    "specialist_logs": gettext_lazy("logs specialist"),
    "specialist_metrics": gettext_lazy("metrics specialist"),
    "specialist_changes_code": gettext_lazy("changes and code specialist"),
    "specialist_knowledge": gettext_lazy("knowledge specialist"),
    "look": gettext_lazy("looking at the evidence"),
    "hand_back": gettext_lazy("handing back"),
    "aggregate": gettext_lazy("combining the findings"),
    "conclude": gettext_lazy("concluding"),
    "read_answer": gettext_lazy("reading the answer"),
    "propose_skills": gettext_lazy("asking to run skills"),
    "run_skills": gettext_lazy("running the approved skills"),
    "propose_fix": gettext_lazy("proposing a fix"),
    "execute_fix": gettext_lazy("applying the fix"),
    "report": gettext_lazy("writing the report"),
}


def choose_mode(
    requested: str, bundled: str, problem_type: str, modes: RunModes
) -> tuple[str, str]:
    """(mode, mode_source): the reporter's preferred mode (the form, the API body or the
    command's --mode; else the bundle's incident.yaml), else the routing matrix's mode for
    the stated problem type, else the default."""
    for preferred in (requested, bundled):
        if preferred in RUN_MODES:
            return preferred, "preferred"
    if problem_type in modes.routing:
        return modes.routing[problem_type], "routing"
    return modes.default, "default"


class ModeChosen(Payload):
    mode: str
    source: str  # preferred | routing | default
    problem_type: str = ""
    preferred: str = ""


class PlannedCall(Payload):
    id: str
    tool: str
    args: dict[str, Any] = {}


class PlannedSpecialist(Payload):
    name: str
    tools: list[str] = []


class Plan(Payload):
    mode: str
    calls: list[PlannedCall] = []
    # what the plan reads once the calls above answered (topology, code): their
    # arguments come from that evidence
    then: list[str] = []
    specialists: list[PlannedSpecialist] = []


class SpecialistReported(Payload):
    specialist: str
    status: str  # completed | failed
    run: int
    evidence: list[str] = []
    reason: str = ""


class AggregatedSpecialist(Payload):
    name: str
    status: str
    run: int | None = None
    reason: str = ""


class Aggregated(Payload):
    specialists: list[AggregatedSpecialist]
    failed: int
    of: int


class ModeSwitched(Payload):
    from_: str = Field(alias="from")  # the payload's key is "from"
    to: str
    reason: str  # no_new_evidence | specialists_failed
    steps: int = 0
    calls: list[str] = []
    failed: list[str] = []
    of: int = 0
    threshold: float = 0.0


def mode_label(mode: str) -> str:
    return str(MODE_LABELS.get(mode, mode))


def _chosen_words(p: dict[str, Any]) -> str:
    return _("run mode %(mode)s, from %(source)s") % {
        "mode": mode_label(p.get("mode", "")),
        "source": SOURCE_LABELS.get(p.get("source", ""), p.get("source", "")),
    }


def _plan_words(p: dict[str, Any]) -> str:
    if p.get("specialists"):
        return _("plan: specialists %(names)s in parallel") % {
            "names": ", ".join(
                str(SPECIALIST_LABELS.get(s["name"], s["name"])) for s in p["specialists"]
            )
        }
    tools = [c["tool"] for c in p.get("calls") or []] + list(p.get("then") or [])
    return _("plan: %(tools)s, then one conclusion") % {"tools": ", ".join(tools) or "-"}


def _specialist_words(p: dict[str, Any]) -> str:
    name = SPECIALIST_LABELS.get(p.get("specialist", ""), p.get("specialist", ""))
    if p.get("status") == "failed":
        return _("specialist %(name)s failed: %(reason)s") % {
            "name": name,
            "reason": p.get("reason", ""),
        }
    return _("specialist %(name)s reported %(count)s evidence calls") % {
        "name": name,
        "count": len(p.get("evidence") or []),
    }


def _aggregated_words(p: dict[str, Any]) -> str:
    return _("evidence of %(ok)s of %(of)s specialists aggregated") % {
        "ok": p.get("of", 0) - p.get("failed", 0),
        "of": p.get("of", 0),
    }


def switch_reason(p: dict[str, Any]) -> str:
    """Why the mode switched, in the reader's language (the timeline, replay, export)."""
    if p.get("reason") == "no_new_evidence":
        return _("%(steps)s steps in a row added no new evidence (%(calls)s)") % {
            "steps": p.get("steps", 0),
            "calls": ", ".join(p.get("calls") or []),
        }
    words = _("%(failed)s of %(of)s specialists failed (%(names)s), over the %(threshold)s%% limit")
    return words % {
        "failed": len(p.get("failed") or []),
        "of": p.get("of", 0),
        "names": ", ".join(str(SPECIALIST_LABELS.get(n, n)) for n in p.get("failed") or []),
        "threshold": round(100 * float(p.get("threshold", 0))),
    }


def _switched_words(p: dict[str, Any]) -> str:
    return _("switched from %(from)s to %(to)s: %(reason)s") % {
        "from": mode_label(p.get("from", "")),
        "to": mode_label(p.get("to", "")),
        "reason": switch_reason(p),
    }


def _chosen_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    return {**snapshot, "run_mode": {"mode": p["mode"], "source": p["source"]}}


def _switched_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    held = dict(snapshot.get("run_mode") or {})
    return {**snapshot, "run_mode": {**held, "now": p["to"], "switched": p["reason"]}}


LINES = "diagnosis_pack/_lines.html"
# The panel shows the mode: it re-renders with these.
PANEL = frozenset({"session-facts"})

EVENT_TYPES = (
    EventType(
        MODE_CHOSEN,
        ModeChosen,
        snapshot=_chosen_snapshot,
        summary=_chosen_words,
        line=f"{LINES}#mode-chosen",
        panels=PANEL,
    ),
    EventType(PLAN, Plan, summary=_plan_words, line=f"{LINES}#plan"),
    EventType(
        SPECIALIST_REPORTED,
        SpecialistReported,
        summary=_specialist_words,
        line=f"{LINES}#specialist-reported",
    ),
    EventType(AGGREGATED, Aggregated, summary=_aggregated_words, line=f"{LINES}#aggregated"),
    EventType(
        MODE_SWITCHED,
        ModeSwitched,
        snapshot=_switched_snapshot,
        summary=_switched_words,
        line=f"{LINES}#mode-switched",
        panels=PANEL,
    ),
)
