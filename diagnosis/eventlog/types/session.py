"""The session's life and what was said in it: created, moved, ended, deleted; messages,
questions, recognised fields, appended timeline entries, the report."""

from __future__ import annotations

from typing import Any

from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, pgettext_lazy

from diagnosis.eventlog import names
from diagnosis.eventlog.registry import ByKey, EventType, Payload
from diagnosis.eventlog.state import (
    EventLike,
    FoldState,
    Message,
    Question,
    ReportState,
    RestrictionState,
    parse_ts,
)
from diagnosis.wording import enrichment_warning, status_words

FACTS = frozenset({"session-facts"})


class SessionCreated(Payload):
    scenario: str
    version: int | None = None
    created_by: str = ""
    title: str = ""
    language: str = ""


def _created(state: FoldState, event: EventLike) -> None:
    p = event.payload
    state.scenario = p.get("scenario", "")
    state.version = p.get("version")
    state.created_by = p.get("created_by", "")
    state.created_at = event.ts
    state.title = p.get("title", "")
    state.language = p.get("language", "")


class StatusChanged(Payload):
    to: str
    reason: str = ""


def _status_changed(state: FoldState, event: EventLike) -> None:
    p = event.payload
    state.status = p["to"]
    if p["to"] == "running" and state.started_at is None:
        state.started_at = event.ts
    if p["to"] in ("completed", "failed", "canceled"):
        state.ended_at = event.ts
    if p["to"] == "failed":
        state.failure = p.get("reason", "")


def _status_words(p: dict[str, Any]) -> str:
    reason = f" ({p['reason']})" if p.get("reason") else ""
    moved = _("status %(from)s → %(to)s") % {
        "from": status_words(p.get("from")),
        "to": status_words(p.get("to")),
    }
    return f"{moved}{reason}"


class Ended(Payload):
    reason: str = ""
    by: str = ""


class Completed(Ended):
    closed_by: str = ""
    summary: str = ""


def _completed(state: FoldState, event: EventLike) -> None:
    p = event.payload
    if p.get("closed_by"):
        state.closed_by = p["closed_by"]
        state.closed_summary = p.get("summary", "")


def _closed_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any] | None:
    # Closed by the operator with a summary: a normal end, distinct from a cancel.
    if not p.get("closed_by"):
        return None
    return {**snapshot, "closed": {"by": p["closed_by"], "summary": p.get("summary", "")}}


class Deleted(Payload):
    by: str | None = None
    reason: str = ""
    at: str | None = None


def _deleted(state: FoldState, event: EventLike) -> None:
    p = event.payload
    state.deleted_at = parse_ts(p.get("at")) or event.ts
    state.deleted_by = p.get("by")
    state.deleted_reason = p.get("reason", "")


class UserMessage(Payload):
    author: str = ""
    text: str
    answers: str | None = None


def _message(state: FoldState, event: EventLike) -> None:
    p = event.payload
    answers = p.get("answers")
    state.messages.append(
        Message(event.seq, event.ts, p.get("author", ""), p.get("text", ""), answers)
    )
    for question in state.questions:
        if question.key == answers and question.answered_seq is None:
            question.answered_seq = event.seq


def _message_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any] | None:
    # An answer closes the question at once (a second answer is refused).
    return {**snapshot, "question": None} if "answers" in p else None


class AgentQuestion(Payload):
    key: str
    field: str
    text: str
    label: str = ""
    # Asked alongside the approvals: the agent goes on without its answer.
    optional: bool = False
    # The operator does not know a required fact: the page points at its correction form.
    offer_correction: bool = False


def _question(state: FoldState, event: EventLike) -> None:
    p = event.payload
    state.questions.append(
        Question(
            event.seq,
            event.ts,
            p["key"],
            p["field"],
            p.get("label", p["field"]),
            p["text"],
            optional=bool(p.get("optional")),
        )
    )


def _question_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    question = {"field": p["field"], "text": p["text"], "key": p["key"]}
    for flag in ("optional", "offer_correction"):
        if p.get(flag):
            question[flag] = True
    return {**snapshot, "question": question}


class QuestionClosed(Payload):
    question: str  # the question's key
    field: str
    label: str = ""
    answered: bool = False
    # Why it closed without its field: "unanswered" (left open when every action was
    # decided), "unsure", "correction", "declined" (a confirmation not given),
    # "unrecognised" (an answer naming no value).
    reason: str = "unanswered"
    # False: a confirmation of an inferred value, not an optional question.
    optional: bool = True


# Why a question closed without an answer (QuestionClosed.reason), in words.
CLOSED_REASONS: dict[str, Any] = {
    "unanswered": pgettext_lazy("question closed", "not answered"),
    "unsure": pgettext_lazy("question closed", "not known yet"),
    "correction": pgettext_lazy("question closed", "a correction came instead"),
    "declined": pgettext_lazy("question closed", "not confirmed"),
    "unrecognised": pgettext_lazy("question closed", "the answer named no value"),
}


def _closed_reason(code: Any) -> str:
    words = CLOSED_REASONS.get(str(code))
    return str(words) if words is not None else str(code)


def _question_closed(state: FoldState, event: EventLike) -> None:
    for question in state.questions:
        if question.key == event.payload["question"] and question.answered_seq is None:
            question.unanswered_seq = event.seq


def _question_closed_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any] | None:
    open_question = snapshot.get("question") or {}
    if open_question.get("key") != p["question"]:
        return None
    return {**snapshot, "question": None}


class FieldsExtracted(Payload):
    changed: dict[str, Any] = {}
    evidence: dict[str, Any] = {}
    missing: list[str] = []


def _fields_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    return {
        **snapshot,
        "fields": {**(snapshot.get("fields") or {}), **p.get("changed", {})},
        "evidence": {**(snapshot.get("evidence") or {}), **p.get("evidence", {})},
        "missing": list(p.get("missing", [])),
        "question": None,
    }


def _fields_words(p: dict[str, Any]) -> str:
    changed = ", ".join(f"{k}={v}" for k, v in (p.get("changed") or {}).items())
    return _("recognised %(what)s") % {"what": changed or _("nothing new")}


# --- timeline.appended: an entry of a kind --------------------------------------------

# What was appended to a session's timeline, by kind (the chronology's words for it); a
# pack adds its own kinds (register_timeline_kind).
TIMELINE_KINDS: dict[str, Promise] = {
    "todo_resolved": gettext_lazy("to-do resolved"),
    "restriction_lifted": gettext_lazy("restriction lifted"),
    "alert": gettext_lazy("alert"),
}
TIMELINE_LINES = {
    "todo_resolved": "timeline-appended-todo-resolved",
    "restriction_lifted": "timeline-appended-restriction-lifted",
    "alert": "timeline-appended-alert",
    # The operator's steering and a switch of scenario (the cockpit's own entries).
    "operator_update": "cockpit",
    "scenario_switched_to": "cockpit",
    "scenario_switched_from": "cockpit",
}


def register_timeline_kind(kind: str, words: Promise, line: str) -> None:
    """A pack's own kind of timeline entry: its words and its line's partial."""
    TIMELINE_KINDS[kind] = words
    TIMELINE_LINES[kind] = line


class TimelineAppended(Payload):
    kind: str


def _appended(state: FoldState, event: EventLike) -> None:
    p = event.payload
    if p.get("kind") == "todo_resolved" and p.get("restriction"):
        # Done by hand ("closed by phone"): the timed-out action's effect is in force.
        done = p["restriction"]
        state.restrictions.append(RestrictionState(done["kind"], done["target"], done["call_id"]))
    elif p.get("kind") == "restriction_lifted":
        for item in state.restrictions:
            same = (item.kind, item.target) == (p.get("restriction"), p.get("target"))
            if same and item.lifted_seq is None:
                item.lifted_by, item.lifted_note = p.get("by"), p.get("note", "")
                item.lifted_seq = event.seq


def _appended_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any] | None:
    if p.get("kind") == "enrichment":
        return {**snapshot, "enrichment": p["enrichment"]}
    if p.get("kind") == "scenario_switched_to":
        return {**snapshot, "switched_to": p["session"]}
    return None


def _appended_words(p: dict[str, Any]) -> str:
    kind = TIMELINE_KINDS.get(str(p.get("kind")), p.get("kind") or "")
    parts = [str(kind), *(str(p[k]) for k in ("by", "title", "note") if p.get(k))]
    text = " ".join(part for part in parts if part)
    warning = enrichment_warning(p.get("enrichment")) if p.get("kind") == "enrichment" else ""
    return f"{text}: {warning}" if warning else text


class ReportReady(Payload):
    markdown: str | None = None
    sha256: str = ""
    language: str = ""
    facts: dict[str, Any] | None = None


def _report(state: FoldState, event: EventLike) -> None:
    p = event.payload
    if "markdown" in p:
        facts = p.get("facts")
        state.report = ReportState(
            event.seq,
            p["markdown"],
            p.get("sha256", ""),
            p.get("language", ""),
            facts if isinstance(facts, dict) else None,
        )


def _line(name: str) -> str:
    return name.replace(".", "-").replace("_", "-")


TYPES = (
    EventType(
        names.SESSION_CREATED,
        SessionCreated,
        reduce=_created,
        line=_line(names.SESSION_CREATED),
    ),
    EventType(
        names.SESSION_STATUS_CHANGED,
        StatusChanged,
        reduce=_status_changed,
        summary=_status_words,
        line=_line(names.SESSION_STATUS_CHANGED),
        internal=True,
        panels=frozenset({"session-status", "session-actions", "session-agents"}),
    ),
    EventType(
        names.SESSION_COMPLETED,
        Completed,
        reduce=_completed,
        snapshot=_closed_snapshot,
        line=ByKey(
            "closed_by", any_value="session-completed-closed-by", default="session-completed"
        ),
    ),
    EventType(names.SESSION_CANCELED, Ended, line=_line(names.SESSION_CANCELED)),
    EventType(names.SESSION_FAILED, Ended, line=_line(names.SESSION_FAILED)),
    EventType(
        names.SESSION_DELETED,
        Deleted,
        reduce=_deleted,
        line=_line(names.SESSION_DELETED),
        panels=frozenset({"session-status", "session-actions"}),
    ),
    EventType(
        names.USER_MESSAGE,
        UserMessage,
        reduce=_message,
        snapshot=_message_snapshot,
        summary=lambda p: f"{p.get('author', '')}: {p.get('text', '')}",
        line=_line(names.USER_MESSAGE),
    ),
    EventType(
        names.AGENT_QUESTION,
        AgentQuestion,
        reduce=_question,
        snapshot=_question_snapshot,
        summary=lambda p: _("agent asks: %(text)s") % {"text": p.get("text", "")},
        line=_line(names.AGENT_QUESTION),
        panels=FACTS,
    ),
    EventType(
        names.AGENT_QUESTION_CLOSED,
        QuestionClosed,
        reduce=_question_closed,
        snapshot=_question_closed_snapshot,
        summary=lambda p: (
            _("question closed without an answer (%(reason)s): %(field)s")
            % {
                "field": p.get("field", ""),
                "reason": _closed_reason(p.get("reason", "unanswered")),
            }
        ),
        line=_line(names.AGENT_QUESTION_CLOSED),
        panels=FACTS,
    ),
    EventType(
        names.FIELDS_EXTRACTED,
        FieldsExtracted,
        snapshot=_fields_snapshot,
        summary=_fields_words,
        line=_line(names.FIELDS_EXTRACTED),
        internal=lambda p: not p.get("changed") and not p.get("missing"),
        panels=FACTS,
    ),
    EventType(
        names.TIMELINE_APPENDED,
        TimelineAppended,
        reduce=_appended,
        snapshot=_appended_snapshot,
        summary=_appended_words,
        line=ByKey("kind", TIMELINE_LINES),
        panels=FACTS,
    ),
    EventType(
        names.REPORT_READY,
        ReportReady,
        reduce=_report,
        snapshot=lambda snapshot, p: {**snapshot, "report": True},
        line=_line(names.REPORT_READY),
        panels=frozenset({"session-report", "session-status"}),
    ),
)
