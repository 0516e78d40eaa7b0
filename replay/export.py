"""The Markdown export of a whole session (diagnosis tech plan §6.2): a template over the
fold of its events. Everything users or the model wrote goes through replay.markdown's
escaping; the generated report is quoted verbatim in an indented code block."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.functional import Promise
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from diagnosis.chain import check_events
from diagnosis.fold import FoldState, fold_events
from diagnosis.models import Event, Session
from diagnosis.wording import (
    FSM_LABELS,
    NODE_LABELS,
    plain,
    stand_mismatch_text,
    status_words,
    step_summary_words,
)
from replay import masking, presenters

Progress = Callable[[int, int], None]
PROGRESS_EVERY = 1000


def summarize(event_type: str, p: dict[str, Any]) -> str:
    """One line of plain text per event for the chronology (escaped by the template)."""
    if event_type == "user.message":
        return f"{p.get('author', '')}: {p.get('text', '')}"
    if event_type == "agent.question":
        return _("agent asks: %(text)s") % {"text": p.get("text", "")}
    if event_type == "session.status_changed":
        reason = f" ({p['reason']})" if p.get("reason") else ""
        moved = _("status %(from)s → %(to)s") % {
            "from": status_words(p.get("from")),
            "to": status_words(p.get("to")),
        }
        return f"{moved}{reason}"
    if event_type == "fields.extracted":
        changed = ", ".join(f"{k}={v}" for k, v in (p.get("changed") or {}).items())
        return _("recognised %(what)s") % {"what": changed or _("nothing new")}
    if event_type.startswith("tool.call_"):
        tail = f": {p['error']}" if p.get("error") else ""
        return f"{p.get('tool_name', '')}({args_text(p.get('args'))}){tail}"
    if event_type.startswith("approval."):
        what = f"{p.get('tool_name', '')} [{p.get('risk_level', '')}]"
        if p.get("by"):
            what = _("%(what)s by %(by)s") % {"what": what, "by": p["by"]}
        reason = f": {p['reason']}" if p.get("reason") else ""
        return f"{what}{reason}"
    if event_type == "risk.assessed":
        return _("risk %(level)s %(score)s by rule %(rule)s") % {
            "level": p.get("level"),
            "score": p.get("score"),
            "rule": p.get("rule"),
        }
    if event_type == "impact.analyzed":
        return _("radius %(radius)s from %(start)s") % {
            "radius": p.get("radius"),
            "start": p.get("start"),
        }
    if event_type == "fsm.transition":
        return f"{plain(FSM_LABELS, p.get('from'))} → {plain(FSM_LABELS, p.get('to'))}"
    if event_type in ("agent.node_started", "agent.node_completed", "agent.node_failed"):
        node = plain(NODE_LABELS, p["node"]) if p.get("node") else ""
        summary = step_summary_words(p.get("summary"))
        return " ".join(str(v) for v in (node, summary, p.get("error")) if v)
    if event_type == "llm.call":
        return _("%(provider)s %(purpose)s %(status)s, tokens in/out %(tokens)s") % {
            "provider": p.get("provider"),
            "purpose": p.get("purpose"),
            "status": p.get("status"),
            "tokens": f"{p.get('tokens_in', 0)}/{p.get('tokens_out', 0)}",
        }
    if event_type == "agent.note" and p.get("outcome"):
        return _("continuing without %(tool)s (%(outcome)s): %(reason)s") % {
            "tool": p.get("tool_name", ""),
            "outcome": p.get("outcome"),
            "reason": p.get("reason") or "—",
        }
    if event_type == "agent.note" and p.get("kind") == "already_in_force":
        return _("%(tool)s not proposed: already in force (session %(session)s)") % {
            "tool": p.get("tool_name", ""),
            "session": p.get("held_by", ""),
        }
    if event_type == "agent.note" and p.get("kind") == "proposed_again":
        return _("%(tool)s again, the corrected facts change it: %(before)s -> %(after)s") % {
            "tool": p.get("tool_name", ""),
            "before": args_text(p.get("before")),
            "after": args_text(p.get("args")),
        }
    if event_type == "agent.note":
        return str(p.get("text", ""))
    if event_type == "timeline.appended":
        kind = TIMELINE_KINDS.get(str(p.get("kind")), p.get("kind") or "")
        parts = [str(kind), *(str(p[k]) for k in ("by", "title", "note") if p.get(k))]
        text = " ".join(part for part in parts if part)
        warning = stand_mismatch_text(p.get("enrichment")) if p.get("kind") == "enrichment" else ""
        return f"{text}: {warning}" if warning else text
    return ""


# What was appended to a session's timeline, by kind (the chronology's words for it).
TIMELINE_KINDS: dict[str, Promise] = {
    "enrichment": gettext_lazy("Flight and position looked up"),
    "todo_resolved": gettext_lazy("to-do resolved"),
    "restriction_lifted": gettext_lazy("restriction lifted"),
    "alert": gettext_lazy("alert"),
}


def args_text(args: Any) -> str:
    """Arguments as k=v pairs, or the word a masked value was replaced by."""
    if args == masking.MASKED or not isinstance(args, dict):
        return str(args or "")
    return ", ".join(f"{k}={v}" for k, v in args.items())


def usage_rows(events: list[Event]) -> list[dict[str, Any]]:
    by_model: dict[tuple[str, str], dict[str, Any]] = {}
    for event in events:
        if event.type != "llm.call":
            continue
        p = event.payload
        row = by_model.setdefault(
            (str(p.get("provider", "")), str(p.get("model", ""))),
            {
                "provider": p.get("provider", ""),
                "model": p.get("model", ""),
                "calls": 0,
                "tokens_in": 0,
                "tokens_out": 0,
                "cost": Decimal(0),
                "failed": 0,
            },
        )
        row["calls"] += 1
        row["failed"] += p.get("status") != "ok"
        row["tokens_in"] += int(p.get("tokens_in") or 0)
        row["tokens_out"] += int(p.get("tokens_out") or 0)
        row["cost"] += Decimal(str(p.get("cost") or 0))
    return sorted(by_model.values(), key=lambda r: (r["provider"], r["model"]))


def follow_ups(state: FoldState) -> list[str]:
    """What someone still has to do, derived from the log alone, in the exporter's
    language."""
    items = []
    for call in state.actions:
        approval = state.approvals.get(call.call_id)
        status = approval.status if approval else ""
        what = {"tool": call.tool_name}
        if status == "rejected":
            items.append(_("%(tool)s was rejected: decide on another measure.") % what)
        elif status == "timeout":
            items.append(_("%(tool)s timed out unapproved: complete its manual to-do.") % what)
        elif status == "canceled":
            items.append(
                _("%(tool)s was never decided (withdrawn, or the session ended first): check it.")
                % what
            )
        elif approval is not None and approval.is_open:
            items.append(_("%(tool)s still awaits a decision.") % what)
        if call.status == "failed":
            items.append(_("%(tool)s failed: check it was carried out by hand.") % what)
    for restriction in state.restrictions:
        if restriction.lifted_seq is None:
            items.append(
                _("%(kind)s %(target)s is closed: lift it once clear.")
                % {"kind": restriction.kind, "target": restriction.target}
            )
    for question in state.questions:
        if question.answered_seq is None:
            items.append(_("Unanswered question: %(text)s") % {"text": question.text})
    if state.status not in ("completed", "canceled", "failed"):
        items.append(
            _("The session was still %(status)s when exported.") % {"status": state.status}
        )
    return items


def render_export(
    session: Session, user: Any, *, masked: bool, progress: Progress | None = None
) -> str:
    """The whole session as Markdown. Reads its events in seq order once."""
    total = session.last_seq
    events: list[Event] = []
    state: FoldState | None = None
    chunk: list[Event] = []
    for event in Event.objects.filter(session=session).order_by("seq").iterator(chunk_size=2000):
        chunk.append(event)
        if len(chunk) == PROGRESS_EVERY:
            state = fold_events(chunk, state)
            events.extend(chunk)
            chunk = []
            if progress:
                progress(len(events), total)
    state = fold_events(chunk, state)  # an empty log folds to the initial state
    events.extend(chunk)
    if progress:
        progress(len(events), total)

    chronology = []
    for event in events:
        payload, _ = presenters.shown_payload(event, masked)
        chronology.append(
            {
                "seq": event.seq,
                "ts": event.ts,
                "type": event.type,
                "summary": summarize(event.type, payload),
            }
        )
    # The chain is checked over the very rows exported: the head printed is theirs.
    chain = check_events(session.pk, events, session.last_seq, session.chain_head)
    context = {
        "chain": chain,
        "session": session,
        "state": state,
        "fields": presenters.field_rows(session, state),
        "evidence": presenters.evidence_calls(state, masked),
        "actions": presenters.action_rows(state, masked),
        "questions": presenters.question_rows(state),
        "usage": usage_rows(events),
        "follow_ups": follow_ups(state),
        "chronology": chronology,
        "masked": masked,
        "exported_by": user.get_username(),
        "exported_at": timezone.localtime(),
        "event_count": len(events),
        "first_ts": events[0].ts if events else None,
        "last_ts": events[-1].ts if events else None,
    }
    return render_to_string("replay/export.md", context)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
