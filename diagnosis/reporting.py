"""The final report: the scenario's template rendered with what the session established."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import markdown as md
import nh3
from django.db import transaction
from django.template import Context, Engine
from django.utils import timezone, translation

from aero.i18n import interface_language
from aero.text import MAX_EVENT_BYTES, cut_generated, neutralise_bidi
from diagnosis.events import append_step_event
from diagnosis.models import (
    WITHDRAWN_ASKED_AGAIN,
    WITHDRAWN_NOT_CALLED_FOR,
    WITHDRAWN_NOT_CALLED_FOR_ANSWER,
    WITHDRAWN_SUPERSEDED,
    AgentRun,
    Report,
    Session,
    ToolCall,
)
from diagnosis.wording import done_words, failure_words

# The longest report kept whole: even at 6 bytes a character (a JSON-escaped control
# character, the widest case) it fits in one event.
MAX_REPORT_CHARS = 40_000
assert MAX_REPORT_CHARS * 6 < MAX_EVENT_BYTES - 1024

DECISIONS = {
    "en": {
        "auto": "automatic (R0)",
        "approved": "approved",
        "rejected": "rejected",
        "timeout": "timed out (manual to-do)",
        "canceled": "closed undecided",  # the reason follows: withdrawn, or the session ended
        "pending": "pending",
    },
    "zh": {
        "auto": "自动执行（R0）",
        "approved": "已批准",
        "rejected": "已拒绝",
        "timeout": "超时（转人工）",
        "canceled": "未决关闭",
        "pending": "待审批",
    },
}


# A withdrawn call's reason (stored in English, models.WITHDRAWN_*) in a Chinese report.
WITHDRAWN_ZH = {
    WITHDRAWN_ASKED_AGAIN: "按先前事实提出；已按更正后的事实重新申请",
    WITHDRAWN_NOT_CALLED_FOR: "更正后的事实不再需要，已撤回",
    WITHDRAWN_SUPERSEDED: "回答后风险重新评估，已被取代并按新的事实重新申请",
    WITHDRAWN_NOT_CALLED_FOR_ANSWER: "回答后风险重新评估，不再需要，已撤回",
}


def action_rows(session_id: Any, language: str) -> list[dict[str, Any]]:
    rows = []
    for call in (
        ToolCall.objects.filter(session_id=session_id, is_action=True)
        .select_related("decided_by")
        .order_by("position", "id")
    ):
        decision = decision_of(call)
        text = DECISIONS.get(language, DECISIONS["en"])[decision]
        if call.decided_by:
            text += f" — {call.decided_by.get_username()}"
        if call.decision_reason:
            reason = call.decision_reason
            if language == "zh":
                reason = WITHDRAWN_ZH.get(reason, reason)
            text += f": {reason}"
        rows.append(
            {
                "tool": call.tool_name,
                "args": call.request_payload,
                "args_text": ", ".join(f"{k}={v}" for k, v in call.request_payload.items()),
                "risk_class": call.risk_class,
                "decision": decision,
                "decision_text": text,
                "status": call.status,
                "reason": call.decision_reason,
                "result": result_words(call, language),
            }
        )
    return rows


def worded_enrichment(enrichment: dict[str, Any], language: str) -> dict[str, Any]:
    """The lookups' results with each unavailable source's reason in the report's
    language (the log keeps it in English)."""
    degraded = enrichment.get("degraded") or []
    if not degraded:
        return enrichment
    with translation.override(interface_language(language)):
        worded = [
            {**d, "error": failure_words(d.get("error"))} if isinstance(d, dict) else d
            for d in degraded
        ]
    return {**enrichment, "degraded": worded}


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


def display_value(spec: dict[str, Any], value: Any, language: str) -> str:
    if value is None:
        return "—"
    if spec["type"] in ("enum", "bool"):
        key = str(value).lower() if isinstance(value, bool) else str(value)
        label = spec.get("values", {}).get(key, {}).get("label", {}).get(language)
        if label:
            return str(label)
    return str(value)


def render_report(
    session_id: Any,
    definition: dict[str, Any],
    state: dict[str, Any],
    preface: str = "",
    extra: dict[str, Any] | None = None,
    postscript: str = "",
) -> tuple[str, str]:
    """The report's Markdown and its language. `preface` (Markdown) goes under the title:
    a canceled session's report says so first; `postscript` (Markdown) goes last (an
    optional question left unanswered). `extra`: what the session's pack adds to
    the template's context (a diagnosis's root cause and evidence)."""
    session = Session.objects.select_related("created_by", "scenario_version").get(pk=session_id)
    language = session.language if session.language in definition["report_template"] else "en"
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
        "generated_at": timezone.localtime().strftime("%Y-%m-%d %H:%M:%S %Z"),
        "fields": state.get("fields") or {},
        "field_rows": field_rows(definition, state.get("fields") or {}, language),
        "risk": state.get("risk") or {},
        "impact": state.get("impact") or {},
        "enrichment": worded_enrichment(state.get("enrichment") or {}, language),
        "actions": action_rows(session_id, language),
        **(extra or {}),
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
    return text, language


def report_sha256(markdown: str) -> str:
    return hashlib.sha256(markdown.encode("utf-8")).hexdigest()


def write_report(
    session_id: Any,
    definition: dict[str, Any],
    state: dict[str, Any],
    *,
    producer: str,
    run: AgentRun | None = None,
    preface: str = "",
    extra: dict[str, Any] | None = None,
    postscript: str = "",
) -> str:
    """Render the report, store it and log its full text and hash in one transaction:
    the `report.ready` event is the record, the Report row its projection. `preface` is
    Markdown: escape what people typed in it (md_cell)."""
    text, language = render_report(session_id, definition, state, preface, extra, postscript)
    # Generated text: a report larger than one event may carry (a long template filled
    # with every message at its limit) is kept up to MAX_REPORT_CHARS and says, in its
    # last line and in the event, that it was cut. The Report row holds exactly
    # what the event holds: the log stays the whole truth.
    text, cut_from = cut_generated(text, MAX_REPORT_CHARS)
    payload: dict[str, Any] = {
        "markdown": text,
        "sha256": report_sha256(text),
        "language": language,
        "length": len(text),
    }
    if cut_from is not None:
        payload["cut_from_chars"] = cut_from
    with transaction.atomic():
        # Keyed inside a graph step: a re-run keeps the report the first run logged.
        event, new = append_step_event(
            session_id,
            "report.ready",
            payload,
            producer=producer,
            run=run,
        )
        if new:
            Report.objects.update_or_create(
                session_id=session_id, defaults={"markdown": text, "language": language}
            )
    return str(event.payload["markdown"])


# --- Markdown escaping ---------------------------------------------------------------
# Characters Python-Markdown (with the tables extension) gives a meaning inline and lets
# a backslash escape. "(" and ")" need none once "[" and "]" are escaped: no link starts;
# "_" inside a word never makes emphasis (lookup_flight_plan stays readable).
_MD_SPECIAL = re.compile(r"([\\`*\[\]|#!{}>]|(?<![^\W_])_|_(?![^\W_]))")
# "<" has no backslash escape in Python-Markdown: the entity shows it as typed and no
# autolink or tag can start.
_MD_LT = re.compile(r"<")
# At the start of a line these make lists, rules or setext headings; the value may start
# one. Only "-"/"+" after spaces, or "." / ")" after digits: "2026-11-25" and a session's
# id ("85533151-3817-...") start no list and stay as typed in the export.
_MD_LINE_START = re.compile(r"^(\s*)([-+])|^(\s*\d+)([.)])")
_MD_SETEXT = re.compile(r"^(\s*)=")
# An entity reference would display as the character it names, not as typed.
_MD_ENTITY = re.compile(r"&(?=#?\w+;)")


def md_escape(text: Any) -> str:
    """User or model text made literal for inline Markdown: what was typed is what shows.
    Newlines stay newlines (a reason may have paragraphs) but each line is escaped."""
    lines = str(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return "\n".join(_escape_line(line) for line in lines)


def md_cell(text: Any) -> str:
    """User or model text made literal inside one Markdown table cell (or one list item):
    line breaks become spaces, so the value cannot end the row or start a block."""
    return _escape_line(str(text).replace("\r\n", " ").replace("\r", " ").replace("\n", " "))


def _escape_line(line: str) -> str:
    line = line.replace("\x00", "\ufffd")
    # Bidirectional controls would reorder the text around the value: their code points.
    line = neutralise_bidi(line)
    line = _MD_ENTITY.sub("&amp;", line)
    line = _MD_SPECIAL.sub(r"\\\1", line)
    line = _MD_LT.sub("&lt;", line)
    line = _MD_SETEXT.sub(r"\1&#61;", line)
    return _MD_LINE_START.sub(_escape_marker, line)


def _escape_marker(match: re.Match[str]) -> str:
    lead, marker = (match[1], match[2]) if match[2] else (match[3], match[4])
    return f"{lead}\\{marker}"


class MdText(str):
    """A context string that Django's autoescaping renders Markdown-escaped (md_cell):
    comparisons in the report template ({% if x == "y" %}) still see the raw value."""

    def __html__(self) -> str:
        return md_cell(self)


def as_markdown_text(value: Any) -> Any:
    """Every string in a report context (nested dicts and lists too) wrapped as MdText."""
    if isinstance(value, str):
        return MdText(value)
    if isinstance(value, dict):
        return {k: as_markdown_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_markdown_text(v) for v in value]
    return value


# --- Markdown to HTML ----------------------------------------------------------------
# What a report may contain once rendered: Python-Markdown's output for the syntax we
# use (headings, lists, tables, emphasis, code, links), nothing that runs or loads.
ALLOWED_TAGS = {
    "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6",
    "hr", "li", "ol", "p", "pre", "strong", "table", "tbody", "td", "th", "thead", "tr",
    "ul",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "td": {"align"},
    "th": {"align"},
    "ol": {"start"},
}
# No javascript:, data: or vbscript:; relative links (no scheme) stay allowed, but not
# the scheme-relative "//host/..." (another site, whatever the page's scheme), nor its
# backslash spellings, which browsers read the same way.
ALLOWED_URL_SCHEMES = {"http", "https", "mailto"}


def _no_other_host(tag: str, attribute: str, value: str) -> str | None:
    if attribute == "href" and value.strip().replace("\\", "/").startswith("//"):
        return None
    return value


def sanitize_html(html: str) -> str:
    """nh3 (ammonia) with the lists above: any other tag is dropped (script and style with
    their content), event attributes and style never pass, links get rel=noopener."""
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        attributes=ALLOWED_ATTRIBUTES,
        url_schemes=ALLOWED_URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        attribute_filter=_no_other_host,
        strip_comments=True,
    )


def markdown_to_html(text: str) -> str:
    """Render report Markdown for the page: raw HTML in it is shown as text (not passed
    through), and the result is sanitised with nh3 whatever the Markdown produced, so a
    scenario template or an escaping slip still cannot put a script or a javascript:
    link on the page."""
    renderer = md.Markdown(extensions=["tables"])
    renderer.preprocessors.deregister("html_block")
    renderer.inlinePatterns.deregister("html")
    return sanitize_html(renderer.convert(text))
