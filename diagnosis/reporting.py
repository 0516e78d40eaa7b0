"""The final report: the scenario's template rendered with what the session established."""

from __future__ import annotations

import hashlib
from typing import Any

import markdown as md
from django.db import transaction
from django.template import Context, Engine
from django.utils import timezone

from diagnosis.events import append_step_event
from diagnosis.models import AgentRun, Report, Session, ToolCall

DECISIONS = {
    "en": {
        "auto": "automatic (R0)",
        "approved": "approved",
        "rejected": "rejected",
        "timeout": "timed out (manual to-do)",
        "canceled": "closed undecided (session canceled)",
        "pending": "pending",
    },
    "zh": {
        "auto": "自动执行（R0）",
        "approved": "已批准",
        "rejected": "已拒绝",
        "timeout": "超时（转人工）",
        "canceled": "未决关闭（会话已取消）",
        "pending": "待审批",
    },
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
            text += f": {call.decision_reason}"
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
                "result": call.response_payload.get("summary", call.error),
            }
        )
    return rows


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
    session_id: Any, definition: dict[str, Any], state: dict[str, Any], preface: str = ""
) -> tuple[str, str]:
    """The report's Markdown and its language. `preface` (Markdown) goes under the title:
    a canceled session's report says so first."""
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
        "enrichment": state.get("enrichment") or {},
        "actions": action_rows(session_id, language),
    }
    # Markdown, not HTML: no autoescaping here; the HTML view strips raw HTML instead.
    template = Engine(autoescape=False).from_string(definition["report_template"][language])
    text = template.render(Context(context)).strip() + "\n"
    if preface and text.startswith("#"):
        title, _, rest = text.partition("\n")
        text = f"{title}\n\n{preface.strip()}\n{rest}"
    elif preface:
        text = f"{preface.strip()}\n\n{text}"
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
) -> str:
    """Render the report, store it and log its full text and hash in one transaction:
    the `report.ready` event is the record, the Report row its projection."""
    text, language = render_report(session_id, definition, state, preface)
    with transaction.atomic():
        # Keyed inside a graph step: a re-run keeps the report the first run logged.
        event, new = append_step_event(
            session_id,
            "report.ready",
            {
                "markdown": text,
                "sha256": report_sha256(text),
                "language": language,
                "length": len(text),
            },
            producer=producer,
            run=run,
        )
        if new:
            Report.objects.update_or_create(
                session_id=session_id, defaults={"markdown": text, "language": language}
            )
    return str(event.payload["markdown"])


def markdown_to_html(text: str) -> str:
    """Render report Markdown for the page. Raw HTML in the Markdown (user text included)
    is escaped, not passed through."""
    renderer = md.Markdown(extensions=["tables"])
    renderer.preprocessors.deregister("html_block")
    renderer.inlinePatterns.deregister("html")
    return renderer.convert(text)
