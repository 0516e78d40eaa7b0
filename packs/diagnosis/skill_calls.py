"""Uploaded skills as evidence tools of the diagnosis (tools.skills, tools.sandbox): the
active R0 skills that declare the incident's problem type are follow-up calls
(`skill:NAME`), made like every evidence call (recorded, keyed by session and call, a
failure recorded with its reason). A skill of risk R1 or above is kept and listed but
never called here: an evidence read runs without approval, so only R0 may."""

from __future__ import annotations

from typing import Any

from django.db.models import F

from diagnosis.agent.slow_tools import call_slow, register_slow_tool
from packs.diagnosis.playbook import Diagnosis
from packs.diagnosis.storage import bundle_dir
from tools.models import SkillVersion
from tools.sandbox import SkillError, run_skill
from tools.skills import active_skills

PREFIX = "skill:"
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
    calls = []
    for index, version in enumerate(active_skills(found.problem_type)):
        if version.risk_class != "R0":
            continue
        declared = version.arguments_schema.get("properties")
        args = {k: v for k, v in facts.items() if k in declared} if declared else facts
        calls.append(
            {
                "call_id": f"ev-skill-{version.skill.name}",
                "tool": version.tool_name,
                "args": args,
                "skill_version": version.pk,
                "position": POSITION + index,
            }
        )
    return calls


def run_skill_call(session_id: Any, call: dict[str, Any]) -> dict[str, Any]:
    """The skill's result over the session's stored bundle (read-only), as a slow tool:
    with waits on, the job ends at the call and the LLM runner runs the skill. A failure
    is SlowToolFailed with the skill's reason (recorded on the call)."""
    return call_slow(
        SKILL_RUN,
        {
            "session": str(session_id),
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
    if version.risk_class != "R0":
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


def _skill_timeout(slow_args: dict[str, Any]) -> float:
    # The sandbox stops the skill at its own deadline: the runner waits a little longer.
    chosen = slow_args.get("skill_version")
    version = SkillVersion.objects.filter(pk=chosen).first() if chosen else None
    limits = (version.manifest.get("limits") if version is not None else None) or {}
    return float(limits.get("timeout_seconds", MAX_SKILL_SECONDS)) + SLACK_SECONDS


def register() -> None:
    register_slow_tool(SKILL_RUN, _skill_run, _skill_timeout)
