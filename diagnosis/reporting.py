"""The final report: the scenario's template rendered with what the session established."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import transaction
from django.template import Context, Engine
from django.utils import timezone, translation
from django.utils.functional import Promise
from django.utils.translation import pgettext_lazy

from aero.i18n import interface_language
from aero.text import MAX_EVENT_BYTES, cut_generated
from diagnosis.eventlog.names import REPORT_READY
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun, Event, Report, Session, ToolCall, ToolCallStatus
from diagnosis.report_markdown import (
    MdText,
    Worded,
    as_markdown_text,
    display_value,
    markdown_to_html,
    md_cell,
    md_escape,
    sanitize_html,
)
from diagnosis.report_notes import notes_words
from diagnosis.wording import (
    NODE_KIND_LABELS,
    RISK_LABELS,
    TOOL_LABELS,
    args_text,
    done_words,
    failure_words,
    plain,
    reason_words,
)

# Re-exported: the report's text helpers are reached through this module too.
__all__ = [
    "MdText",
    "Worded",
    "as_markdown_text",
    "display_value",
    "markdown_to_html",
    "md_cell",
    "md_escape",
    "sanitize_html",
]

# The longest report kept whole: even at 6 bytes a character (a JSON-escaped control
# character, the widest case) it fits in one event.
MAX_REPORT_CHARS = 40_000
assert MAX_REPORT_CHARS * 6 < MAX_EVENT_BYTES - 1024

# How each action was decided, as the report's table says it.
DECISIONS: dict[str, Promise] = {
    "auto": pgettext_lazy("decision", "automatic (R0)"),
    "approved": pgettext_lazy("decision", "approved"),
    "rejected": pgettext_lazy("decision", "rejected"),
    "timeout": pgettext_lazy("decision", "timed out (manual to-do)"),
    # the reason follows: withdrawn, or the session ended
    "canceled": pgettext_lazy("decision", "closed undecided"),
    "pending": pgettext_lazy("decision", "pending"),
}


def action_rows(
    session_id: Any,
    language: str,
    definition: dict[str, Any] | None = None,
    calls: list[ToolCall] | None = None,
) -> list[dict[str, Any]]:
    """The session's actions as the report's table reads them, in `language`: each
    tool, argument and state in words (the code stays the value a template compares).
    `calls`: the session's calls in order when the caller has read them (decided_by
    selected with them)."""
    if calls is None:
        calls = list(
            ToolCall.objects.filter(session_id=session_id, is_action=True)
            .select_related("decided_by")
            .order_by("position", "id")
        )
    rows = []
    with translation.override(interface_language(language)):
        for call in (c for c in calls if c.is_action):
            decision = decision_of(call)
            text = str(DECISIONS[decision])
            if call.decided_by:
                text += f" — {call.decided_by.get_username()}"
            if call.decision_reason:
                text += f": {reason_words(call.decision_reason)}"
            status = (
                ToolCallStatus(call.status).label
                if call.status in ToolCallStatus.values
                else call.status
            )
            rows.append(
                {
                    "tool": Worded(call.tool_name, plain(TOOL_LABELS, call.tool_name)),
                    "args": call.request_payload,
                    "args_text": args_text(call.tool_name, call.request_payload, definition),
                    "risk_class": call.risk_class,
                    "decision": decision,
                    "decision_text": text,
                    "status": Worded(call.status, status),
                    "reason": call.decision_reason,
                    "result": result_words(call, language),
                }
            )
    return rows


def worded_enrichment(enrichment: dict[str, Any], language: str) -> dict[str, Any]:
    """The lookups' results in the report's language: each unavailable source's reason
    (the log keeps it in English) and each place's kind (a stand, a taxiway) in words."""
    with translation.override(interface_language(language)):
        worded = {
            key: {**found, "kind": Worded(found["kind"], plain(NODE_KIND_LABELS, found["kind"]))}
            if isinstance(found, dict) and str(found.get("kind")) in NODE_KIND_LABELS
            else found
            for key, found in enrichment.items()
        }
        degraded = enrichment.get("degraded") or []
        if degraded:
            worded["degraded"] = [
                {**d, "error": failure_words(d.get("error"))} if isinstance(d, dict) else d
                for d in degraded
            ]
    return worded


def worded_risk(risk: dict[str, Any], language: str) -> dict[str, Any]:
    """The assessed risk with its level in words (the code stays what templates compare)."""
    if not risk or "level" not in risk:
        return risk
    with translation.override(interface_language(language)):
        return {**risk, "level": Worded(risk["level"], plain(RISK_LABELS, risk["level"]))}


def result_words(call: ToolCall, language: str) -> str:
    """What an executed action did, in the report's language (the log keeps English);
    the error for one that failed."""
    with translation.override(interface_language(language)):
        done = done_words(call.tool_name, call.request_payload, call.response_payload)
    return done or str(call.response_payload.get("summary", call.error))


def decision_of(call: ToolCall) -> str:
    if call.risk_class == "R0":
        return "auto"
    if call.status in ("awaiting_approval", "proposed"):
        return "pending"
    if call.status in ("rejected", "timeout", "canceled"):
        return call.status
    return "approved"


def field_rows(
    definition: dict[str, Any], fields: dict[str, Any], language: str
) -> list[dict[str, Any]]:
    rows = []
    for name in definition["field_order"]:
        spec = definition["fields"][name]
        rows.append(
            {
                "name": name,
                "label": spec["label"][language],
                "value": fields.get(name),
                "display": display_value(spec, fields.get(name), language),
            }
        )
    return rows


# What a report is rendered from, of the session's state when it was written.
REPORT_STATE = ("fields", "risk", "impact", "enrichment")


def report_facts(
    state: dict[str, Any], notes: list[dict[str, Any]] | None = None, extra: Any = None
) -> dict[str, Any]:
    """The facts a report is worded from, language-neutral, as `report.ready` logs them:
    the state's findings, when it was written, its notes (report_notes: a cancel, a
    close, corrections) and what the session's pack adds (texts as {"zh", "en"} pairs)."""
    return {
        "state": {key: state[key] for key in REPORT_STATE if state.get(key)},
        "generated_at": timezone.localtime().strftime("%Y-%m-%d %H:%M:%S %Z"),
        "notes": list(notes or []),
        "extra": extra or {},
    }


def in_language(value: Any, language: str) -> Any:
    """`value` with each {"zh": ..., "en": ...} pair replaced by its text in `language`
    (the other one when that is empty)."""
    if isinstance(value, dict):
        if value and set(value) <= {"zh", "en"}:
            return value.get(language) or next((v for v in value.values() if v), "")
        return {k: in_language(v, language) for k, v in value.items()}
    if isinstance(value, list):
        return [in_language(v, language) for v in value]
    return value


def render_report(
    session: Session,
    definition: dict[str, Any],
    facts: dict[str, Any],
    language: str,
    calls: list[ToolCall] | None = None,
) -> str:
    """compose_report kept to MAX_REPORT_CHARS (the cut says so in its last line)."""
    text = compose_report(session, definition, facts, language, calls)
    return cut_generated(text, MAX_REPORT_CHARS)[0]


def compose_report(
    session: Session,
    definition: dict[str, Any],
    facts: dict[str, Any],
    language: str,
    calls: list[ToolCall] | None = None,
) -> str:
    """The report's Markdown in `language` ("zh" or "en"; the scenario's English
    template when it has none in that language), worded from `facts` (report_facts) and
    the session's actions as they stand."""
    language = language if language in definition["report_template"] else "en"
    state = facts.get("state") or {}
    with translation.override(interface_language(language)):
        preface, postscript = notes_words(facts.get("notes") or [], definition, language)
    context = {
        "session": {
            "id": str(session.pk),
            "created_by": session.created_by.get_username(),
            "created_at": session.created_at,
            "language": language,
        },
        "scenario": {
            "slug": definition["slug"],
            "name": definition["name"][language],
            "version": session.scenario_version.number,
        },
        "generated_at": facts.get("generated_at")
        or timezone.localtime().strftime("%Y-%m-%d %H:%M:%S %Z"),
        "fields": state.get("fields") or {},
        "field_rows": field_rows(definition, state.get("fields") or {}, language),
        "risk": worded_risk(state.get("risk") or {}, language),
        "impact": state.get("impact") or {},
        "enrichment": worded_enrichment(state.get("enrichment") or {}, language),
        "actions": action_rows(session.pk, language, definition, calls),
        **in_language(facts.get("extra") or {}, language),
    }
    # Markdown, not HTML: the engine's autoescaping is pointed at Markdown instead (every
    # string in the context is an MdText, whose __html__ is md_cell), so user and model
    # text can neither break a table nor become a link; the template's own text is as
    # the scenario author wrote it.
    template = Engine(autoescape=True).from_string(definition["report_template"][language])
    text = template.render(Context(as_markdown_text(context))).strip() + "\n"
    if preface and text.startswith("#"):
        title, _, rest = text.partition("\n")
        text = f"{title}\n\n{preface.strip()}\n{rest}"
    elif preface:
        text = f"{preface.strip()}\n\n{text}"
    if postscript:
        text = f"{text}\n{postscript.strip()}\n"
    return text


def report_sha256(markdown: str) -> str:
    return hashlib.sha256(markdown.encode("utf-8")).hexdigest()


def reader_language(language: str | None = None) -> str:
    """A scenario-text language ("zh" or "en") for an interface language (default: the
    active one)."""
    return "zh" if (language or translation.get_language() or "").startswith("zh") else "en"


def report_text(
    session: Session,
    markdown: str,
    facts: Any,
    language: str | None = None,
    definition: dict[str, Any] | None = None,
    calls: list[ToolCall] | None = None,
) -> str:
    """A logged report in the reader's language (default: the active one), worded from
    its facts at read time; a report logged before reports kept their facts reads as
    it was written."""
    if not isinstance(facts, dict):
        return markdown
    definition = definition or session.scenario_version.definition
    return render_report(session, definition, facts, reader_language(language), calls)


def session_report(session: Session, language: str | None = None) -> str | None:
    """The session's report (its last `report.ready`) in the reader's language; None
    before one was written."""
    payload = (
        Event.objects.filter(session_id=session.pk, type=REPORT_READY)
        .order_by("-seq")
        .values_list("payload", flat=True)
        .first()
    )
    if payload is None:
        return None
    return report_text(session, str(payload.get("markdown") or ""), payload.get("facts"), language)


def write_report(
    session_id: Any,
    definition: dict[str, Any],
    state: dict[str, Any],
    *,
    producer: str,
    run: AgentRun | None = None,
    notes: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> str:
    """Log the report's facts (report_facts) and its text in the session's language in
    one transaction: the `report.ready` event is the record (its text hashed and
    searched), the Report row its projection. Pages render it again in each reader's
    language from the facts. `notes`: report_notes' facts (a cancel, a close...)."""
    session = Session.objects.select_related("created_by", "scenario_version").get(pk=session_id)
    facts = report_facts(state, notes, extra)
    language = session.language if session.language in definition["report_template"] else "en"
    # Generated text: a report larger than one event may carry (a long template filled
    # with every message at its limit) is kept up to MAX_REPORT_CHARS and says, in its
    # last line and in the event, that it was cut.
    text, cut_from = cut_generated(
        compose_report(session, definition, facts, language), MAX_REPORT_CHARS
    )
    payload: dict[str, Any] = {
        "markdown": text,
        "sha256": report_sha256(text),
        "language": language,
        "length": len(text),
        "facts": facts,
    }
    if cut_from is not None:
        payload["cut_from_chars"] = cut_from
    if len(json.dumps(payload, ensure_ascii=False).encode()) > MAX_EVENT_BYTES - 1024:
        # Facts too large for one event: the report reads as written, in one language.
        del payload["facts"]
    with transaction.atomic():
        # Keyed inside a graph step: a re-run keeps the report the first run logged.
        event, new = append_step_event(
            session_id,
            REPORT_READY,
            payload,
            producer=producer,
            run=run,
        )
        if new:
            Report.objects.update_or_create(
                session_id=session_id, defaults={"markdown": text, "language": language}
            )
    return str(event.payload["markdown"])
