"""The timeline in an operator's words (a template builtin, see TEMPLATES in settings).

`{% event_view event as v %}` gives what diagnosis/_event.html shows: whether the entry
is an agent internal (folded under "details"), and plain labels for the codes in its
payload. Scenario texts (field and value labels) come from the scenario definition in
the template's context when there is one, in the interface language; without it the
field's code name shows. No queries: the definition is already in the context."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import template
from django.utils.dateparse import parse_datetime
from django.utils.functional import Promise
from django.utils.translation import (
    get_language,
    gettext,
    gettext_lazy,
    pgettext,
    pgettext_lazy,
)

from aero.packs import argument_words, target_args
from diagnosis.consequences import plain_words
from diagnosis.eventlog import registry
from diagnosis.reporting import display_value
from diagnosis.wording import (
    CALL_OUTCOME_LABELS,
    FSM_LABELS,
    NODE_KIND_LABELS,
    PRIORITY_LABELS,
    PROVIDER_LABELS,
    PURPOSE_LABELS,
    RISK_CLASS_LABELS,
    RISK_LABELS,
    TOOL_LABELS,
    agent_words,
    args_words,
    argument_value_words,
    evidence_words,
    plain,
    status_words,
    step_summary_words,
)
from diagnosis.wording import done_words as wording_done_words
from diagnosis.wording import enrichment_warning as wording_enrichment_warning
from diagnosis.wording import failure_words as wording_failure_words
from scenarios_admin.definition import shown_as_decision

register = template.Library()


def scenario_language() -> str:
    """Scenarios carry zh and en texts; the interface language picks one."""
    return "zh" if (get_language() or "").startswith("zh") else "en"


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def is_internal(event_type: str, payload: dict[str, Any]) -> bool:
    """An agent internal (how the agent worked, not what happened): kept in the log and
    replay, folded on the session page. The event type declares it."""
    return registry.is_internal(event_type, payload)


def scenario_name(definition: dict[str, Any] | None, slug: Any, language: str) -> str:
    """A scenario's name in `language` from the session's definition (no query); its slug
    when the definition is not at hand or names another scenario."""
    names = (definition or {}).get("name")
    if not isinstance(names, dict) or (definition or {}).get("slug", slug) != slug:
        return str(slug or "")
    return str(names.get(language) or slug or "")


def field_label(definition: dict[str, Any] | None, name: str, language: str) -> str:
    spec = (definition or {}).get("fields", {}).get(name)
    if not spec:
        return name
    return str(spec.get("label", {}).get(language) or name)


def field_display(definition: dict[str, Any] | None, name: str, value: Any, language: str) -> str:
    spec = (definition or {}).get("fields", {}).get(name)
    if not spec:
        return str(value)
    return display_value(spec, value, language)


def condition_display(
    definition: dict[str, Any] | None, name: str, value: Any, language: str
) -> str:
    """A risk rule's condition on one field: a value, any of a list, or `not` a value."""
    field = name.split(".")[0]
    if isinstance(value, list):
        return " / ".join(field_display(definition, field, v, language) for v in value)
    if isinstance(value, dict) and "not" in value:
        shown = condition_display(definition, name, value["not"], language)
        return str(pgettext("a condition that a value is not met", "not %(value)s")) % {
            "value": shown
        }
    if "." in name:  # position.kind: runway
        return str(value)
    return field_display(definition, field, value, language)


def because(
    definition: dict[str, Any] | None, when: dict[str, Any], language: str
) -> list[dict[str, str]]:
    """A risk rule's conditions as field labels and values (the code in `code`)."""
    return [
        {
            "code": f"{name}={value}",
            "label": field_label(definition, name.split(".")[0], language),
            "display": condition_display(definition, name, value, language),
        }
        for name, value in when.items()
    ]


@register.simple_tag(takes_context=True)
def risk_because(context: template.Context, when: Any) -> list[dict[str, str]]:
    if not isinstance(when, dict):
        return []
    return because(context.get("definition"), when, scenario_language())


EVENT_LINES_TEMPLATE = registry.EVENT_LINES_TEMPLATE


def event_line(event_type: str, payload: dict[str, Any]) -> str:
    """The partial that shows this event: the one its type declares."""
    return registry.timeline_line(event_type, payload)


@register.simple_tag(takes_context=True)
def event_rows(context: template.Context, events: Any) -> list[Any]:
    """`{% event_rows events as rows %}`: each event's row (diagnosis/_event.html), read
    from the rows rendered before (diagnosis.timeline_rows) or rendered now."""
    from diagnosis.timeline_rows import rows

    return list(rows(list(events), context.get("definition")))


@register.simple_tag(takes_context=True)
def event_view(context: template.Context, event: Any) -> dict[str, Any]:
    payload: dict[str, Any] = event.payload if isinstance(event.payload, dict) else {}
    definition = context.get("definition")
    language = scenario_language()
    tool = str(payload.get("tool_name", ""))
    args = as_dict(payload.get("args"))
    changed = as_dict(payload.get("changed"))
    when = as_dict(payload.get("when"))
    label = plain(TOOL_LABELS, tool) if tool else ""
    which = ", ".join(str(args[k]) for k in target_args() if args.get(k) not in (None, ""))
    return {
        "line": event_line(event.type, payload),
        "internal": is_internal(event.type, payload),
        "tool": label,
        # With what the action acts on (taxiway A, stand 105): two decisions on the same
        # tool are told apart by it (not by the long free text some actions carry).
        "tool_which": f"{label} ({which})" if which else label,
        "args": ", ".join(argument_value_words(tool, k, v, definition) for k, v in args.items()),
        "plain": plain_words(tool, args) if shown_as_decision(tool) else "",
        "node": agent_words(payload.get("node", "")) if payload.get("node") else "",
        "changes": [
            {
                "code": f"{name}={value}",
                "label": field_label(definition, name, language),
                "display": field_display(definition, name, value, language),
            }
            for name, value in changed.items()
        ],
        "missing": [
            {"code": name, "label": field_label(definition, name, language)}
            for name in payload.get("missing") or []
        ],
        # A model's values the operator's words contradict (fields.extracted "dropped").
        "dropped": [
            {
                "label": field_label(definition, name, language),
                "model": field_display(definition, name, note.get("value"), language),
                "kept": field_display(definition, name, note.get("kept"), language),
            }
            for name, note in as_dict(payload.get("dropped")).items()
            if isinstance(note, dict)
        ],
        "fsm_from": plain(FSM_LABELS, payload.get("from", "")),
        "fsm_to": plain(FSM_LABELS, payload.get("to", "")),
        "level": plain(RISK_LABELS, payload.get("level", "")),
        "because": because(definition, when, language),
        "risk_class": plain(RISK_CLASS_LABELS, payload.get("risk_level", "")),
        # session.created names the scenario by its slug: its name in the reader's language
        "scenario": scenario_name(definition, payload.get("scenario"), language),
        # llm.call: which provider, why and how it ended, in words (codes in tooltips)
        "provider": plain(PROVIDER_LABELS, payload.get("provider", "")),
        "purpose": plain(PURPOSE_LABELS, payload.get("purpose", "")),
        "outcome": plain(CALL_OUTCOME_LABELS, payload.get("status", "")),
        # agent.run_started / agent.run_ended: the child run by its words, how long it ran
        "agent": agent_words(payload["agent"]) if payload.get("agent") else "",
        "run_status": plain(RUN_STATUS_LABELS, payload.get("status", "")),
        "run_elapsed": _run_elapsed(payload),
        # A closure already in force: since when (older notes do not say).
        "held_since": parse_datetime(str(payload["held_since"]))
        if payload.get("held_since")
        else None,
    }


def _run_elapsed(payload: dict[str, Any]) -> timedelta | None:
    started = parse_datetime(str(payload.get("started_at") or ""))
    ended = parse_datetime(str(payload.get("ended_at") or ""))
    return max(ended - started, timedelta(0)) if started and ended else None


@register.filter
def tool_label(code: str) -> str:
    return plain(TOOL_LABELS, code)


@register.filter
def fsm_label(code: str) -> str:
    return plain(FSM_LABELS, code)


@register.filter
def priority_label(code: str) -> str:
    return plain(PRIORITY_LABELS, code)


@register.filter
def risk_label(code: str) -> str:
    return plain(RISK_LABELS, code)


@register.filter
def risk_class_label(code: str) -> str:
    return plain(RISK_CLASS_LABELS, code)


@register.filter
def evidence_label(evidence: str) -> str:
    return evidence_words(str(evidence))


DECISION_LABELS: dict[str, Promise] = {
    "auto": pgettext_lazy("decision", "automatic"),
    "pending": pgettext_lazy("decision", "pending"),
    "approved": pgettext_lazy("decision", "approved"),
    "rejected": pgettext_lazy("decision", "rejected"),
    "timeout": pgettext_lazy("decision", "timed out"),
    "canceled": pgettext_lazy("decision", "canceled"),
    # The first of an R2/R3 approval's two steps (replay lists each step).
    "first_approved": pgettext_lazy("decision", "approved once (1 of 2)"),
}


@register.filter
def decision_label(code: str) -> str:
    return plain(DECISION_LABELS, code)


RUN_STATUS_LABELS: dict[str, Promise] = {
    "running": pgettext_lazy("agent run", "running"),
    "completed": pgettext_lazy("agent run", "completed"),
    "failed": pgettext_lazy("agent run", "failed"),
}


@register.filter
def run_status_label(code: str) -> str:
    """An agent run's status in words (replay's run tree)."""
    return plain(RUN_STATUS_LABELS, code)


# How an agent run works (AgentRun.mode); a pack's own mode shows by its code.
MODE_LABELS: dict[str, Promise] = {
    "react": gettext_lazy("ReAct"),
    "plan_execute": gettext_lazy("Plan and execute"),
    "hierarchical": gettext_lazy("Hierarchical"),
}


@register.filter
def mode_label(code: str) -> str:
    return plain(MODE_LABELS, code)


@register.filter
def agent_label(name: str) -> str:
    """An agent run's name in words: a step of the agent's graph by what it does, the
    job's run and a pack's steps by their registered words, any other by its own name."""
    return agent_words(name)


@register.filter
def duration(value: timedelta | None) -> str:
    """How long something took, as people read it: "850 ms", "12.3 s", "3 min 04 s"."""
    if value is None:
        return ""
    seconds = value.total_seconds()
    if seconds < 1:
        return gettext("%(ms)d ms") % {"ms": round(seconds * 1000)}
    if seconds < 60:
        return gettext("%(s).1f s") % {"s": seconds}
    whole = int(seconds)
    if whole < 3600:
        return gettext("%(m)d min %(s)02d s") % {"m": whole // 60, "s": whole % 60}
    return gettext("%(h)d h %(m)02d min") % {"h": whole // 3600, "m": whole % 3600 // 60}


@register.filter
def node_kind_label(code: str) -> str:
    return plain(NODE_KIND_LABELS, code)


@register.filter
def argument_label(name: str) -> str:
    """An action argument's name in words ("位置" for position); the name itself when it
    has none."""
    return plain(argument_words(), name)


@register.simple_tag(takes_context=True)
def worded_args(context: template.Context, tool: str, args: Any) -> list[dict[str, str]]:
    """An action's arguments in words (`{% worded_args tool args as words %}`): each
    label and value as a reader reads them, the code for a tooltip. The tower message
    is composed from its facts with the session's definition in the context."""
    return args_words(tool, args, context.get("definition"))


@register.filter
def step_summary(summary: Any) -> str:
    """An agent step's logged summary in the reader's language."""
    return step_summary_words(summary)


@register.filter
def failure_words(error: Any) -> str:
    """A logged failure in the reader's language (as logged when AERO does not word it)."""
    return wording_failure_words(error)


@register.simple_tag
def done_words(tool: str, args: Any, response: Any) -> str:
    """An executed action's result in the reader's language (the log keeps English)."""
    return wording_done_words(tool, args, response)


@register.filter
def enrichment_warning(enrichment: Any) -> str:
    """The warning a pack reads from what the lookups found (timeline, session page,
    approval queue); "" when there is none."""
    return wording_enrichment_warning(enrichment)


@register.filter
def status_label(code: str) -> str:
    """A session's status in words (the code when it is none of SessionStatus)."""
    return status_words(code)


@register.filter
def call_status_label(code: str) -> str:
    from diagnosis.models import ToolCallStatus

    return str(ToolCallStatus(code).label) if code in ToolCallStatus.values else str(code)
