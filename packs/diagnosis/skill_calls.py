"""Uploaded skills as evidence tools of the diagnosis (tools.skills, tools.sandbox): the
active R0 skills that declare the incident's problem type are follow-up calls
(`skill:NAME`), made like every evidence call (recorded, keyed by session and call, a
failure recorded with its reason). A skill of risk R1 or above is not a follow-up: it is
proposed after the conclusion and runs only once approved (packs.diagnosis.skill_gate)."""

from __future__ import annotations

from typing import Any

from django.db.models import F

from diagnosis.agent.slow_tools import call_slow, register_slow_tool
from diagnosis.models import ToolCall, ToolCallStatus
from packs.diagnosis.playbook_data import Diagnosis
from packs.diagnosis.storage import bundle_dir
from tools.models import SkillVersion
from tools.names import SKILL_TOOL_PREFIX
from tools.sandbox import SkillError, run_skill
from tools.skills import active_skills

PREFIX = SKILL_TOOL_PREFIX
SKILL_RUN = "skill_run"
# A manifest may ask for at most this long (tools.skills.Limits); the runner's margin.
MAX_SKILL_SECONDS = 120.0
SLACK_SECONDS = 5.0
# Where skill calls stand in the evidence list: after the code reads (30 + frames).
POSITION = 60


def is_skill(tool: str) -> bool:
    return tool.startswith(PREFIX)


def skill_calls(found: Diagnosis, window: dict[str, str]) -> list[dict[str, Any]]:
    """One call per active R0 skill applying to the reading's problem type; its
    arguments are the incident's facts its arguments schema names (all when it names
    none)."""
    facts: dict[str, Any] = {
        "problem_type": found.problem_type,
        "since": window["since"],
        "until": window["until"],
        "services": list(dict.fromkeys([*found.candidates, *found.related_services])),
        "candidates": list(found.candidates),
        "root_cause_service": found.service or "",
    }
    return _calls(facts, gated=False)


def gated_skill_calls(conclusion: dict[str, Any]) -> list[dict[str, Any]]:
    """One call per active skill of risk R1 or above applying to the conclusion's
    problem type, to propose for approval: its arguments are `{"version", "arguments"}`
    (what the approval card shows), its risk the version's."""
    candidates = [c["service"] for c in conclusion.get("candidates") or [] if c.get("service")]
    since, until = conclusion["window"]
    facts: dict[str, Any] = {
        "problem_type": conclusion.get("problem_type") or "",
        "since": since,
        "until": until,
        "services": list(dict.fromkeys([*candidates, *conclusion.get("related_services", [])])),
        "candidates": list(dict.fromkeys(candidates)),
        "root_cause_service": conclusion.get("service") or "",
    }
    return _calls(facts, gated=True)


def _calls(facts: dict[str, Any], *, gated: bool) -> list[dict[str, Any]]:
    calls = []
    for index, version in enumerate(active_skills(facts["problem_type"])):
        if (version.risk_class != "R0") != gated:
            continue
        declared = version.arguments_schema.get("properties")
        args = {k: v for k, v in facts.items() if k in declared} if declared else facts
        call: dict[str, Any] = {
            "call_id": f"ev-skill-{version.skill.name}",
            "tool": version.tool_name,
            "args": args,
            "skill_version": version.pk,
            "position": POSITION + index,
        }
        if gated:
            call.update(
                args={"version": version.version, "arguments": args},
                risk_class=version.risk_class,
                is_action=False,  # no effect outside AERO: its decision is all there is
            )
        calls.append(call)
    return calls


def run_skill_call(session_id: Any, call: dict[str, Any]) -> dict[str, Any]:
    """The skill's result over the session's stored bundle (read-only), as a slow tool:
    with waits on, the job ends at the call and the LLM runner runs the skill. A failure
    is SlowToolFailed with the skill's reason (recorded on the call)."""
    return call_slow(
        SKILL_RUN,
        {
            "session": str(session_id),
            "call_id": call["call_id"],
            "tool": call["tool"],
            "args": dict(call["args"]),
            "skill_version": call.get("skill_version"),
        },
    )


def _skill_run(call: dict[str, Any]) -> dict[str, Any]:
    session_id = call["session"]
    # the version chosen when the call was made; a call read back without it (a plan
    # event's) runs the skill's active version
    name = call["tool"].removeprefix(PREFIX)
    versions = SkillVersion.objects.select_related("skill").filter(skill__name=name)
    if call.get("skill_version"):
        version = versions.filter(pk=call["skill_version"]).first()
    else:
        version = versions.filter(skill__active_version=F("pk")).first()
    if version is None:
        raise LookupError(f"{call['tool']}: no such skill version")
    if version.risk_class != "R0" and not _approved(session_id, call.get("call_id", "")):
        raise PermissionError(f"{call['tool']}: risk {version.risk_class} needs an approval")
    ran = run_skill(version, dict(call["args"]), bundle_dir(session_id))
    if not ran.ok:
        raise SkillError(ran)
    summary = ran.result.get("summary")
    return {
        "skill": version.skill.name,
        "version": version.version,
        "result": ran.result,
        "summary": f"{version.skill.name} {version.version}: "
        + (summary if isinstance(summary, str) else "answered"),
    }


def _approved(session_id: Any, call_id: str) -> bool:
    """An approver approved this session's call of the skill (and it has not run)."""
    return ToolCall.objects.filter(
        session_id=session_id, call_id=call_id, status=ToolCallStatus.APPROVED
    ).exists()


def _skill_timeout(slow_args: dict[str, Any]) -> float:
    # The sandbox stops the skill at its own deadline: the runner waits a little longer.
    chosen = slow_args.get("skill_version")
    version = SkillVersion.objects.filter(pk=chosen).first() if chosen else None
    limits = (version.manifest.get("limits") if version is not None else None) or {}
    return float(limits.get("timeout_seconds", MAX_SKILL_SECONDS)) + SLACK_SECONDS


def register() -> None:
    register_slow_tool(SKILL_RUN, _skill_run, _skill_timeout)
