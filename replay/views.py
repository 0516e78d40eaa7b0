from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django.conf import settings
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from aero.http import HtmxHttpRequest
from aero.packs import pack_for
from aero.roles import ADMIN, VIEW_SESSIONS, has_role, role_required, user_roles
from diagnosis.agent_tree import AgentTree, read_tree
from diagnosis.chain import verify_chain
from diagnosis.eventlog.masking import masks_roles, session_mask
from diagnosis.models import Event, Session
from diagnosis.reporting import markdown_to_html
from replay import history, jobs, presenters
from replay.export import render_export
from replay.forms import EVENT_GROUPS, HISTORY_SORTS, HistoryForm, ReplayForm


def get_replay_session(session_id: UUID) -> Session:
    """Replay shows deleted sessions too (marked deleted): the log is kept for audit."""
    return get_object_or_404(
        Session.objects.select_related("scenario", "scenario_version", "created_by", "deleted_by"),
        pk=session_id,
    )


def _filters(session: Session, data: dict[str, Any], tree: AgentTree) -> presenters.Filters:
    run = data.get("run")
    return presenters.Filters(
        groups=list(data.get("groups") or []),
        # Events carry the run that wrote them (Event.run): the chosen run's and its
        # descendants'. A person's events and a job's status changes belong to no run.
        run_ids=presenters.run_subtree(tree, session, run) if run else None,
        since=data.get("since"),
        until=data.get("until"),
    )


def _filter_query(data: dict[str, Any], **extra: Any) -> str:
    """The filters as a query string, for every link the player makes."""
    pairs: list[tuple[str, Any]] = [("groups", g) for g in data.get("groups") or []]
    for name in ("run", "since", "until"):
        if data.get(name):
            value = data[name]
            pairs.append((name, value.isoformat() if hasattr(value, "isoformat") else value))
    pairs.extend((k, v) for k, v in extra.items() if v not in (None, ""))
    return urlencode(pairs)


def replay_context(
    request: HtmxHttpRequest, session: Session, data: dict[str, Any]
) -> dict[str, Any]:
    mask = session_mask(session, user_roles(request.user))
    # The runs' model texts as this viewer may see them.
    tree = read_tree(session.pk, mask)
    filters = _filters(session, data, tree)
    seq = data.get("seq")
    if data.get("at"):
        seq = presenters.seq_at_time(session, filters, data["at"])
    if seq is None:
        seq = presenters.navigation(session, filters, 0)["first"] or 0
    seq = min(seq, session.last_seq)
    masked = mask is not None
    folded = presenters.state_at(session, seq)
    state = presenters.shown_state(folded, mask)
    nav = presenters.navigation(session, filters, seq)
    window, earlier, later = presenters.event_window(
        session, filters, seq, data.get("after"), data.get("before")
    )
    # The listed window usually holds the current step; a filter may leave it out.
    current = next((e for e in window if e.seq == seq), None)
    if current is None:
        current = Event.objects.filter(session=session, seq=seq).first()
    shown = [*window, *([current] if current and current not in window else [])]
    for event in shown:  # shown, never saved
        event.payload, keys = presenters.shown_payload(event, mask)
        event.masked_keys = keys  # type: ignore[attr-defined]
    speed = data.get("play") or ""
    links = {
        name: f"?{_filter_query(data, seq=target, play=speed)}"
        for name, target in nav.items()
        if target is not None
    }
    # The session's pack may show what it found by then in its own panel.
    pack = pack_for(session.scenario_version.definition["kind"])
    pack_panel: dict[str, Any] = {}
    if pack.page_panel is not None and pack.replay_context is not None:
        pack_panel = {"pack_panel": pack.page_panel, **pack.replay_context(session, folded, mask)}
    return {
        **pack_panel,
        "session": session,
        "seq": seq,
        "current": current,
        "state": state,
        "masked": masked,
        "fields": presenters.field_rows(session, state),
        "pack_facts": pack.replay_facts_template,
        # The rule's conditions in words (risk_because reads the scenario's labels).
        "definition": session.scenario_version.definition,
        "actions": presenters.action_rows(state, mask),
        "evidence": presenters.evidence_calls(state, mask),
        # The apron's map only where its facts panel shows (a pack panel replaces both).
        "map": {} if pack_panel else presenters.impact_map_at(presenters.page_world(), folded),
        "impact": state.impact,
        "questions": presenters.question_rows(state),
        "report_html": markdown_to_html(presenters.report_markdown(state, mask, session))
        if state.report
        else "",
        "nav": nav,
        "links": links,
        "events": window,
        "earlier_link": f"?{_filter_query(data, seq=seq, before=earlier)}" if earlier else "",
        "later_link": f"?{_filter_query(data, seq=seq, after=later)}" if later else "",
        "here": f"?{_filter_query(data, seq=seq)}",
        "filter_query": _filter_query(data),
        "speed": speed,
        "next_play": links.get("next") if speed and nav["next"] else "",
        "delay_ms": int(1000 / float(speed)) if speed else 0,
        # meta refresh counts whole seconds
        "refresh_seconds": max(1, round(1 / float(speed))) if speed else 0,
        "speeds": ["0.5", "1", "2", "4", "8"],
        "tree": tree,
        "selected_run": data.get("run"),
        # A run's ancestors unfold, so the chosen run shows.
        "unfolded_runs": tree.path(data["run"]) if data.get("run") else [],
        "tree_query": _filter_query({**data, "run": None}),
        "groups": EVENT_GROUPS,
        "selected_groups": data.get("groups") or [],
        "filters_active": filters.active,
        "deleted": session.deleted_at is not None,
    }


@require_GET
@role_required(VIEW_SESSIONS)
def replay_step(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    session = get_replay_session(session_id)
    form = ReplayForm(request.GET)
    if not form.is_valid():
        return render(
            request,
            "replay/step.html",
            {"session": session, "form": form, "invalid": True},
            status=400,
        )
    if (form.cleaned_data.get("seq") or 0) > session.last_seq:
        form.add_error("seq", f"This session has {session.last_seq} events.")
        return render(
            request,
            "replay/step.html",
            {"session": session, "form": form, "invalid": True},
            status=400,
        )
    context = replay_context(request, session, form.cleaned_data)
    context["form"] = form
    template = "replay/step.html"
    if request.htmx and not request.htmx.boosted:
        template += "#replay-body"
    elif session.last_seq <= settings.AERO_REPLAY_CHAIN_INLINE_EVENTS:
        # Small logs are verified with the page; a long one loads the check on its own.
        context["chain"] = verify_chain(session.pk)
    return render(request, template, context)


@require_GET
@role_required(VIEW_SESSIONS)
def replay_chain(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """The session's hash chain, verified now (it reads every event: its own request)."""
    session = get_replay_session(session_id)
    template = "replay/chain.html"
    if request.htmx:
        template += "#chain-state"
    return render(request, template, {"session": session, "chain": verify_chain(session.pk)})


@require_GET
@role_required(VIEW_SESSIONS)
def replay_event(request: HtmxHttpRequest, session_id: UUID, seq: int) -> HttpResponse:
    """One event's full original payload (masked for read-only viewers, never dropped)."""
    session = get_replay_session(session_id)
    event = get_object_or_404(Event, session=session, seq=seq)
    mask = session_mask(session, user_roles(request.user))
    payload, masked_keys = presenters.shown_payload(event, mask)
    template = "replay/event.html"
    if request.htmx:
        template += "#event-payload"
    return render(
        request,
        template,
        {
            "session": session,
            "event": event,
            "payload_json": json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=True),
            "masked_keys": masked_keys,
        },
    )


@require_POST
@role_required(VIEW_SESSIONS)
def replay_export(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """Small sessions download at once; large ones export in the background."""
    session = get_replay_session(session_id)
    masked = masks_roles(user_roles(request.user))
    if session.last_seq > settings.AERO_REPLAY_EXPORT_INLINE_EVENTS:
        job = jobs.start_export(session, request.user, masked=masked)
        return redirect("replay:export-status", job_id=job.job_id)
    text = render_export(session, request.user, masked=masked)
    jobs.audit_export(session, request.user, text, masked=masked, mode="direct")
    return _download(session, text)


def _download(session: Session, text: str) -> HttpResponse:
    response = HttpResponse(text, content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="aero-session-{session.pk}.md"'
    return response


def _job_for(request: HtmxHttpRequest, job_id: str) -> jobs.ExportJob:
    """An export is its requester's (admins may see any): others get 404, as if unknown."""
    job = jobs.get_job(job_id)
    if job is None or (job.user_id != request.user.pk and not has_role(request.user, (ADMIN,))):
        raise Http404("No such export.")
    return job


@require_GET
@role_required(VIEW_SESSIONS)
def export_status(request: HtmxHttpRequest, job_id: str) -> HttpResponse:
    job = _job_for(request, job_id)
    session = get_replay_session(UUID(job.session_id))
    template = "replay/export_status.html"
    if request.htmx:
        template += "#export-progress"
    return render(request, template, {"job": job, "session": session})


@require_GET
@role_required(VIEW_SESSIONS)
def export_download(request: HtmxHttpRequest, job_id: str) -> HttpResponse:
    job = _job_for(request, job_id)
    text = jobs.job_body(job) if job.status == "done" else None
    if text is None:
        raise Http404("This export is not ready (or has expired).")
    session = get_replay_session(UUID(job.session_id))
    jobs.audit_export(session, request.user, text, masked=job.masked, mode="background")
    return _download(session, text)


@require_GET
@role_required(VIEW_SESSIONS)
def history_search(request: HtmxHttpRequest) -> HttpResponse:
    form = HistoryForm(request.GET)
    if not form.is_valid():
        return render(
            request,
            "replay/history.html",
            {"form": form, "rows": [], "sorts": HISTORY_SORTS},
            status=400,
        )
    page = history.search(form.cleaned_data, roles=user_roles(request.user))
    data = {k: v for k, v in request.GET.items() if k != "cursor" and v}
    template = "replay/history.html"
    if request.htmx and not request.htmx.boosted:
        template += "#history-results"
    return render(
        request,
        template,
        {
            "form": form,
            "rows": page.rows,
            "next_link": f"?{urlencode({**data, 'cursor': page.next_cursor})}"
            if page.next_cursor
            else "",
            "first_link": f"?{urlencode(data)}" if form.cleaned_data.get("cursor") else "",
            "sort": form.cleaned_data.get("sort") or "-created",
            "sort_links": [
                (k, label, f"?{urlencode({**data, 'sort': k})}")
                for k, label in HISTORY_SORTS.items()
            ],
            "sorts": HISTORY_SORTS,
        },
    )
