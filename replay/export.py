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
from django.utils.translation import gettext as _

from aero.packs import DomainPack, UnknownDomain, pack_for
from diagnosis.agent_tree import read_tree
from diagnosis.chain import check_events
from diagnosis.eventlog import masking, registry
from diagnosis.eventlog.names import LLM_CALL
from diagnosis.fold import FoldState, fold_events
from diagnosis.models import Event, Session
from replay import presenters

Progress = Callable[[int, int], None]
PROGRESS_EVERY = 1000


def summarize(event_type: str, p: dict[str, Any]) -> str:
    """One line of plain text per event for the chronology (escaped by the template): the
    words its type declares."""
    return registry.summary(event_type, p)


def usage_rows(events: list[Event]) -> list[dict[str, Any]]:
    by_model: dict[tuple[str, str], dict[str, Any]] = {}
    for event in events:
        if event.type != LLM_CALL:
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
                "estimated": False,
            },
        )
        row["estimated"] = row["estimated"] or bool(p.get("estimated"))
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

    # The one masking rule, for a masked viewer: payloads, calls and every text that may
    # quote what they hide (the embedded report, reasons, follow-ups).
    mask = masking.session_mask(session, ()) if masked else None
    state = presenters.shown_state(state, mask)
    chronology = []
    for event in events:
        payload, _ = presenters.shown_payload(event, mask)
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
    items = follow_ups(state)
    # The agent tree as its rows stand (runs are not in the fold): an indented list.
    tree = read_tree(session.pk, mask)
    context = {
        "agent_tree": tree,
        "agent_rows": [{"node": node, "indent": "  " * depth} for node, depth in tree.walk()],
        "chain": chain,
        "session": session,
        "state": state,
        "fields": presenters.field_rows(session, state),
        "evidence": presenters.evidence_calls(state, mask),
        "actions": presenters.action_rows(state, mask),
        "questions": presenters.question_rows(state),
        "usage": usage_rows(events),
        "follow_ups": [mask.text(item) for item in items] if mask else items,
        "report_markdown": presenters.report_markdown(state, mask, session),
        "closed_summary": mask.text(state.closed_summary) if mask else state.closed_summary,
        "chronology": chronology,
        "masked": masked,
        "exported_by": user.get_username(),
        "exported_at": timezone.localtime(),
        "event_count": len(events),
        "first_ts": events[0].ts if events else None,
        "last_ts": events[-1].ts if events else None,
    }
    template = "replay/export.md"
    pack = installed_pack(session)
    if pack is not None and pack.export_template:
        # The pack's sections (a diagnosis's root cause, fixes, similar cases; the apron's
        # impact) in its own template, which extends this one.
        template = pack.export_template
        if pack.export_context is not None:
            context.update(pack.export_context(session, mask))
    return render_to_string(template, context)


def installed_pack(session: Session) -> DomainPack | None:
    try:
        return pack_for(session.scenario.kind)
    except UnknownDomain:
        return None


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
