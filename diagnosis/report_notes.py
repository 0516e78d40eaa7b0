"""A report's notes (how the session ended, what changed on the way) as facts, and
their words in the report's language.

The facts are logged with the report (`report.ready`'s `facts.notes`), language-neutral:
who, what they typed, which fields and calls. What people typed is quoted as written;
the rest is worded when the report is read, in the reader's language.

- `{"kind": "canceled", "by", "reason"}`: a heading note (the reason may be empty);
- `{"kind": "closed", "by", "summary"}`: a heading note and the conclusion;
- `{"kind": "budget_stopped", "by", "outcome", "reason"}`: a heading note;
- `{"kind": "corrections", "reassessed": [{"changed", "answered", "before", "after"}],
  "withdrawn": [{"tool", "args"}], "kept": [...]}`: facts changed after the risk was
  assessed (a closing section);
- `{"kind": "unanswered", "fields": [...]}`: optional questions left unanswered.
"""

from __future__ import annotations

from typing import Any

from django.utils.functional import Promise
from django.utils.translation import gettext, pgettext, pgettext_lazy

from diagnosis.report_markdown import display_value, md_cell
from diagnosis.wording import RISK_LABELS, TOOL_LABELS, args_text, plain, reason_words


def _quoted(text: Any) -> str:
    return f"“{md_cell(text)}”" if text else ""


def _heading(note: dict[str, Any]) -> str:
    by = md_cell(note.get("by") or "")
    kind = note.get("kind")
    if kind == "canceled":
        reason = _quoted(note.get("reason"))
        if reason:
            return gettext(
                "> **Canceled** by %(by)s before the response was complete: %(reason)s. "
                "Actions still awaiting a decision were closed undecided and were not "
                "executed."
            ) % {"by": by, "reason": reason}
        return gettext(
            "> **Canceled** by %(by)s before the response was complete. Actions still "
            "awaiting a decision were closed undecided and were not executed."
        ) % {"by": by}
    if kind == "closed":
        return gettext(
            "> **Closed** by %(by)s with this summary: %(summary)s. Actions still awaiting "
            "a decision were closed undecided and were not executed."
        ) % {"by": by, "summary": _quoted(note.get("summary"))}
    if kind == "budget_stopped":
        why = (
            reason_words(note["reason"])
            if note.get("reason")
            else _OUTCOMES.get(str(note.get("outcome")), str(note.get("outcome") or ""))
        )
        return gettext(
            "> **Stopped** when the model budget ran out: %(by)s did not approve continuing "
            "(%(reason)s). This report records what was done up to then."
        ) % {"by": by, "reason": md_cell(why)}
    return ""


# How a request to continue past the model budget ended without an approval.
_OUTCOMES: dict[str, Promise] = {
    "rejected": pgettext_lazy("decision", "rejected"),
    "timeout": pgettext_lazy("decision", "timed out"),
    "canceled": pgettext_lazy("decision", "canceled"),
}


def _changed(changed: dict[str, Any], definition: dict[str, Any], language: str) -> str:
    fields = definition.get("fields", {})
    return pgettext("list separator", ", ").join(
        f"{md_cell(fields[n]['label'][language])} → "
        f"{md_cell(display_value(fields[n], v, language))}"
        for n, v in changed.items()
        if n in fields
    )


def _risk(risk: dict[str, Any]) -> str:
    return gettext("%(level)s (rule %(rule)s)") % {
        "level": plain(RISK_LABELS, risk.get("level")),
        "rule": md_cell(risk.get("rule") or "—"),
    }


def _calls(calls: list[dict[str, Any]], definition: dict[str, Any]) -> str:
    worded = []
    for call in calls:
        tool = str(call.get("tool", ""))
        args = {k: v for k, v in (call.get("args") or {}).items() if k != "message"}
        label = md_cell(plain(TOOL_LABELS, tool))
        worded.append(f"{label} ({md_cell(args_text(tool, args, definition))})" if args else label)
    return pgettext("list separator", ", ").join(worded)


def _corrections(note: dict[str, Any], definition: dict[str, Any], language: str) -> str:
    lines = [gettext("## Facts changed after the risk was assessed") + "\n"]
    for risk in note.get("reassessed") or []:
        values = {
            "what": _changed(risk.get("changed") or {}, definition, language),
            "before": _risk(risk.get("before") or {}),
            "after": _risk(risk.get("after") or {}),
        }
        if risk.get("answered"):
            text = gettext(
                "- Answered (%(what)s): re-assessed from %(before)s to %(after)s; the "
                "actions were proposed again for the new facts."
            )
        else:
            text = gettext(
                "- Corrected (%(what)s): re-assessed from %(before)s to %(after)s; the "
                "actions were proposed again for the corrected facts."
            )
        lines.append(text % values)
    if note.get("withdrawn"):
        lines.append(
            gettext(
                "- Withdrawn before a decision, the new facts no longer call for them: %(calls)s."
            )
            % {"calls": _calls(note["withdrawn"], definition)}
        )
    if note.get("kept"):
        lines.append(
            gettext(
                "- Approved under the earlier facts and kept as history (the new facts no "
                "longer call for them): %(calls)s."
            )
            % {"calls": _calls(note["kept"], definition)}
        )
    return "\n".join(lines)


def _closing(note: dict[str, Any], definition: dict[str, Any], language: str) -> str:
    kind = note.get("kind")
    if kind == "closed":
        return gettext("## Conclusion\n\n%(summary)s\n\n(closed by %(by)s)") % {
            "summary": _quoted(note.get("summary")),
            "by": md_cell(note.get("by") or ""),
        }
    if kind == "corrections":
        return _corrections(note, definition, language)
    if kind == "unanswered":
        fields = definition.get("fields", {})
        labels = pgettext("list separator", ", ").join(
            md_cell(fields[n]["label"][language]) for n in note.get("fields") or [] if n in fields
        )
        return gettext(
            "> **Optional question not answered:** %(labels)s. Every action was decided "
            "without it; an answer would have re-assessed the risk."
        ) % {"labels": labels}
    return ""


def notes_words(
    notes: list[dict[str, Any]], definition: dict[str, Any], language: str
) -> tuple[str, str]:
    """(the heading notes, the closing sections) in the active language; `language`
    ("zh"/"en") picks the scenario's labels."""
    preface = "\n\n".join(filter(None, (_heading(n) for n in notes if isinstance(n, dict))))
    postscript = "\n".join(
        filter(None, (_closing(n, definition, language) for n in notes if isinstance(n, dict)))
    )
    return preface, postscript
