"""Plain words for the codes the agent and the scenarios use (tools, compliance states,
checklist priorities, risk levels, evidence kinds): what an operator reads. The code
itself stays available (pages put it in a title attribute, the log keeps it)."""

from __future__ import annotations

import functools
import re
from typing import Any

from django.utils import translation
from django.utils.functional import Promise
from django.utils.translation import gettext, ngettext, pgettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from aero.packs import action_tool, argument_words, installed_packs
from diagnosis.agent import summaries
from diagnosis.agent.tools import FAILURES, dispatch_summary, restriction_summary
from diagnosis.models import (
    WITHDRAWN_ASKED_AGAIN,
    WITHDRAWN_NOT_CALLED_FOR,
    WITHDRAWN_NOT_CALLED_FOR_ANSWER,
    WITHDRAWN_SUPERSEDED,
    SessionStatus,
)
from diagnosis.restrictions import kinds as restriction_kinds

TOOL_LABELS: dict[str, Promise] = {
    # the core's own action (a pack's tools are registered by the pack:
    # register_tool_labels; the lift's words by the pack whose restrictions it lifts)
    "continue_budget": _("Continue past the model budget"),
    # the agent's own analyses
    "assess_risk": _("Assess the risk"),
    "analyze_impact": _("Analyse the impact"),
}


def register_tool_labels(labels: dict[str, Promise]) -> None:
    """A domain pack's tools' words (from its AppConfig.ready()); a name already worded
    keeps its words."""
    for name, label in labels.items():
        TOOL_LABELS.setdefault(name, label)


# The compliance states the scenarios use (their `compliance.states`).
FSM_LABELS: dict[str, Promise] = {
    "INIT": _("Started"),
    "FIELDS_COLLECTED": _("Facts collected"),
    "RISK_ASSESSED": _("Risk assessed"),
    "IMPACT_ANALYZED": _("Impact analysed"),
    "DECIDED": _("Actions decided"),
    "ACTIONS_DECIDED": _("Actions decided"),
    "REPORTED": _("Report written"),
}

PRIORITY_LABELS: dict[str, Promise] = {
    "P1": pgettext_lazy("checklist priority", "required"),
    "P2": pgettext_lazy("checklist priority", "if known"),
}

RISK_LABELS: dict[str, Promise] = {
    "HIGH": pgettext_lazy("risk level", "High"),
    "MEDIUM": pgettext_lazy("risk level", "Medium"),
    "LOW": pgettext_lazy("risk level", "Low"),
}

RISK_CLASS_LABELS: dict[str, Promise] = {
    "R0": _("runs automatically"),
    "R1": _("needs an approval"),
    "R2": _("needs an approval and a confirmation"),
    "R3": _("needs an approval and a confirmation with a reason"),
}

EVIDENCE_LABELS: dict[str, Promise] = {
    "default": _("scenario default (not reported)"),
}


def evidence_words(evidence: str) -> str:
    """Where a field's value came from, in the reader's language, when AERO wrote it (a
    default, a correction, a confirmation); "" when the evidence is the operator's own
    words (shown as a quote). The log keeps the language-neutral form ("corrected by
    alice", "confirmed: 是")."""
    if evidence in EVIDENCE_LABELS:
        return str(EVIDENCE_LABELS[evidence])
    if evidence.startswith("corrected by "):
        return gettext("corrected by %(who)s") % {"who": evidence.removeprefix("corrected by ")}
    if evidence.startswith("confirmed: "):
        answer = evidence.removeprefix("confirmed: ")
        return gettext("confirmed by the operator (“%(answer)s”)") % {"answer": answer}
    if evidence.startswith("denied: "):
        answer = evidence.removeprefix("denied: ")
        return gettext("denied by the operator (“%(answer)s”)") % {"answer": answer}
    return ""


NODE_LABELS: dict[str, Promise] = {
    "input_parser": _("reading the message"),
    "reasoning": _("reasoning"),
    "ask_user": _("asking"),
    "tool_executor": _("running tools"),
    "await_approval": _("waiting for approvals"),
    "compliance_validator": _("compliance check"),
    "output_generator": _("writing the report"),
}


# Agent runs by name (AgentRun.agent_name): the job's root run and, beyond the graph's own
# steps (NODE_LABELS), what a pack registers for its steps (register_agent_labels).
AGENT_LABELS: dict[str, Promise] = {
    "incident_agent": _("incident agent"),
}


def register_agent_labels(labels: dict[str, Promise]) -> None:
    """A domain pack's agents' and steps' words; a name already worded keeps its words."""
    for name, label in labels.items():
        AGENT_LABELS.setdefault(name, label)


def agent_words(name: object) -> str:
    """An agent run's name in words: a step of the core's graph, the root run or a pack's
    registered step; any other by its own name."""
    code = str(name)
    if code in NODE_LABELS:
        return str(NODE_LABELS[code])
    return plain(AGENT_LABELS, code)


# The kinds of the places of a pack's world (its lookups name them), registered by the
# pack (register_node_kind_labels).
NODE_KIND_LABELS: dict[str, Promise] = {}


def register_node_kind_labels(labels: dict[str, Promise]) -> None:
    """A domain pack's words for the kinds of its world's places."""
    for kind, label in labels.items():
        NODE_KIND_LABELS.setdefault(kind, label)


# The model providers AERO ships (a configured provider shows by the name its admin gave
# it: data), why a call was made (llm.call "purpose") and how it ended.
PROVIDER_LABELS: dict[str, Promise] = {
    "offline": _("offline model"),
}

PURPOSE_LABELS: dict[str, Promise] = {
    "extract": _("reading the facts"),
    "reason": _("choosing the next step"),
}

CALL_OUTCOME_LABELS: dict[str, Promise] = {
    "ok": pgettext_lazy("model call", "answered"),
    "error": pgettext_lazy("model call", "failed"),
}


def plain(table: dict[str, Promise], code: object) -> str:
    """The words for `code`, or the code itself when it has none (a new tool or state
    then still shows, in its own name)."""
    text = table.get(str(code))
    return str(text) if text is not None else str(code)


def enrichment_warning(enrichment: Any) -> str:
    """The warning a pack reads from what a session's lookups found, in the viewer's
    language; "" when none."""
    for pack in installed_packs():
        if pack.enrichment_warning is not None and (found := pack.enrichment_warning(enrichment)):
            return found
    return ""


# A pack's words for what its own tools found (an evidence call's result), by tool:
# (tool, the call's response) -> words in the active language.
RESULT_WORDS: dict[str, Any] = {}


def register_result_words(tools: Any, words: Any) -> None:
    """A domain pack's wording of its tools' results (from its AppConfig.ready())."""
    for tool in tools:
        RESULT_WORDS.setdefault(str(tool), words)


def done_words(tool: str, args: Any, response: Any) -> str:
    """An executed action's result in the reader's language ("滑行道已关闭：A"): the log
    keeps it in English. The logged summary when the result is not one AERO words (a
    lift, an older row); "" when there is none."""
    if not isinstance(response, dict) or not response.get("summary"):
        return ""
    if tool in RESULT_WORDS:
        return str(RESULT_WORDS[tool](tool, response)) or str(response["summary"])
    restriction = response.get("restriction")
    if isinstance(restriction, dict) and restriction.get("kind") in restriction_kinds():
        return restriction_summary(str(restriction["kind"]), restriction.get("target", ""))
    declared = action_tool(tool)
    if declared is not None and declared.done is not None and isinstance(args, dict):
        return dispatch_summary(tool, args)
    return str(response["summary"])


@functools.cache
def _failure_patterns() -> list[tuple[re.Pattern[str], str]]:
    """Each known failure's logged (English) text as a pattern that reads its values back."""
    patterns = []
    with translation.override("en"):
        for code, text in FAILURES.items():
            english = re.escape(str(text))
            pattern = re.sub(r"%\\\(([a-z_]+)\\\)s", r"(?P<\1>.+?)", english)
            patterns.append((re.compile(f"^{pattern}$"), code))
    return patterns


def failure_words(error: Any) -> str:
    """A logged failure in the reader's language ("no flight plan for XX123" reads "没有
    XX123 的航班计划" in zh-hans); any other text as logged."""
    text = str(error or "")
    for pattern, code in _failure_patterns():
        if found := pattern.match(text):
            return str(FAILURES[code]) % found.groupdict()
    return text


# A pack's wording of its own steps' summaries: (logged text) -> words, or None when the
# text is none of its own (registered from its AppConfig.ready()).
SUMMARY_WORDS: list[Any] = []


def register_summary_words(words: Any) -> None:
    if words not in SUMMARY_WORDS:
        SUMMARY_WORDS.append(words)


def step_summary_words(summary: Any) -> str:
    """An agent step's logged summary (diagnosis.agent.summaries: "3 call(s) handled",
    "state RISK_ASSESSED") in the reader's language; any other text as logged. The tool
    and field codes it names stay (tooltips and the lines around them word those)."""
    text = str(summary or "")
    words = _summary_words(text)
    if words is not None:
        return words
    if "; " in text:
        # A step that did the work of two ("5 call(s) handled; state RISK_ASSESSED"): each
        # part in the reader's words. Only after the whole text matched nothing: a pack's
        # own summaries may hold "; " themselves.
        return "; ".join(step_summary_words(part) for part in text.split("; "))
    return text


def _summary_words(text: str) -> str | None:
    """`text` worded by the first summary pattern, or a pack's words, that knows it."""
    for pattern, kind in summaries.PATTERNS:
        found = pattern.match(text)
        if found is None:
            continue
        if kind == "fields":
            n = int(found["n"])
            words = ngettext("%(n)s fact recognised", "%(n)s facts recognised", n) % {"n": n}
            if found["missing"]:
                words += gettext("; missing: %(fields)s") % {"fields": found["missing"]}
            return words
        if kind == "calls":
            n = int(found["n"])
            words = ngettext("%(n)s call handled", "%(n)s calls handled", n) % {"n": n}
            if found["refused"]:
                words += gettext("; %(n)s refused") % {"n": found["refused"]}
            return words
        if kind == "ask":
            return gettext("asks for %(field)s") % {"field": found["field"]}
        if kind == "call":
            tools = [plain(TOOL_LABELS, t.strip()) for t in found["tools"].split(",")]
            return gettext("calls %(tools)s") % {
                "tools": pgettext("list separator", ", ").join(tools)
            }
        if kind == "state":
            return gettext("compliance state: %(state)s") % {
                "state": plain(FSM_LABELS, found["state"])
            }
        if kind == "plan":
            plan = {"await": gettext("waits for decisions"), "finish": gettext("finishes")}
            return plan[found["step"]]
        return gettext("report written")
    for pack_words in SUMMARY_WORDS:
        if (found_words := pack_words(text)) is not None:
            return str(found_words)
    return None


def status_words(code: Any) -> str:
    """A session status in the reader's words (the code when it is none of SessionStatus)."""
    return str(SessionStatus(code).label) if code in SessionStatus.values else str(code or "")


def argument_value_words(tool: str, name: str, value: Any, definition: Any = None) -> str:
    """An action argument's value in the reader's words when its pack words it (the
    tower message, composed from its facts); otherwise as written (a stand, a flight)."""
    declared = action_tool(tool)
    if declared is not None and declared.value_words is not None:
        return declared.value_words(name, value, definition)
    return str(value)


def args_words(tool: str, args: Any, definition: Any = None) -> list[dict[str, str]]:
    """An action's arguments as a reader reads them: each name and value in words, the
    code and the value as logged kept for a tooltip."""
    if not isinstance(args, dict):
        return []
    words = argument_words()
    return [
        {
            "code": f"{name}={value}",
            "label": plain(words, name),
            "value": argument_value_words(tool, name, value, definition),
        }
        for name, value in args.items()
    ]


def args_text(tool: str, args: Any, definition: Any = None) -> str:
    """args_words on one line ("位置=105；消息=…")."""
    return pgettext("argument separator", "; ").join(
        f"{a['label']}={a['value']}" for a in args_words(tool, args, definition)
    )


# Reasons AERO itself logs with a decision (in English, language-neutral): a withdrawn
# call's, the command line's default. Any other reason is a person's words.
REASON_WORDS: dict[str, Promise] = {
    WITHDRAWN_ASKED_AGAIN: _(
        "requested under the earlier facts; asked again for the corrected ones"
    ),
    WITHDRAWN_NOT_CALLED_FOR: _("no longer called for by the corrected facts"),
    WITHDRAWN_SUPERSEDED: _(
        "superseded: an answer re-assessed the risk; asked again for the new facts"
    ),
    WITHDRAWN_NOT_CALLED_FOR_ANSWER: _("no longer called for after an answer re-assessed the risk"),
    "approved from the command line": _("approved from the command line"),
    "rejected from the command line": _("rejected from the command line"),
}


def reason_words(reason: Any) -> str:
    """A decision's reason: AERO's own in the reader's words, a person's quoted as
    written."""
    text = str(reason or "")
    if text in REASON_WORDS:
        return str(REASON_WORDS[text])
    return f"“{text}”" if text else ""


def audit_tool_words(value: Any, detail: dict[str, Any]) -> str | None:
    """An audited decision's tool in words (aero.audit_words); None when it has none."""
    label = TOOL_LABELS.get(str(value))
    return str(label) if label is not None else None


def audit_args_words(value: Any, detail: dict[str, Any]) -> str | None:
    """An audited decision's arguments in words, with its tool's words for them."""
    if not isinstance(value, dict):
        return None
    return args_text(str(detail.get("tool", "")), value) or "—"
