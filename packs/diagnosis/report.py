"""A diagnosis's report fields (seed 003's `diagnosis_reports`: root_cause_md,
fix_suggestion_md, confidence_score, related_services, code_locations, and the similar
cases), read from the session's conclusion, fix calls and similar-case links; shown by
the API, the command line's JSON and the Markdown export."""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string
from django.utils import translation

from diagnosis.models import Event, Session
from diagnosis.reporting import action_rows, as_markdown_text
from packs.diagnosis.knowledge import linked_cases
from packs.diagnosis.names import REQUESTED


def report_fields(session: Session, language: str | None = None) -> dict[str, Any]:
    """The fields in `language` (default: the session's); empty before a conclusion."""
    lang = language or session.language
    lang = "zh" if lang.startswith("zh") else "en"
    cause: dict[str, Any] = (session.snapshot or {}).get("root_cause") or {}
    similar = linked_cases(session)
    fixes = action_rows(session.pk, lang)
    context = as_markdown_text(
        {
            "cause": cause,
            "summary": (cause.get("summary") or {}).get(lang, ""),
            "fixes": fixes,
            "similar": similar,
        }
    )
    with translation.override(lang):
        root_cause_md = (
            render_to_string("diagnosis_pack/root_cause.md", context).strip() if cause else ""
        )
        fix_md = (
            render_to_string("diagnosis_pack/fix_suggestion.md", context).strip() if cause else ""
        )
    return {
        "root_cause_md": root_cause_md,
        "fix_suggestion_md": fix_md,
        "confidence_score": cause.get("confidence"),
        "related_services": cause.get("related_services", []),
        "code_locations": [
            {"path": loc["path"], "line": loc["line"]} for loc in cause.get("code_locations", [])
        ],
        "similar_cases": [
            {"id": c["id"], "title": c["title"], "score": c["score"], "strategy": c["strategy"]}
            for c in similar
        ],
    }


def export_context(session: Session, mask: Any) -> dict[str, Any]:
    """What the diagnosis export adds (in the exporter's language): the report fields,
    each text a masked viewer may not see scrubbed, and the conclusion's own values."""
    fields = report_fields(session, translation.get_language() or session.language)
    cause: dict[str, Any] = (session.snapshot or {}).get("root_cause") or {}
    requested = (
        Event.objects.filter(session=session, type=REQUESTED).values_list("payload", flat=True)
    ).first() or {}
    if mask is not None:
        fields = mask.scrub(fields)
    return {"diagnosis": {**fields, "cause": cause, "requested": requested}}
