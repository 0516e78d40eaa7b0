from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.translation import gettext
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from aero.drafts import keep_draft, take_draft
from aero.http import HtmxHttpRequest
from aero.models import audit
from aero.packs import installed_packs, pack_for
from aero.roles import (
    DELETE_SESSIONS,
    RUN_SESSIONS,
    VIEW_SESSIONS,
    has_role,
    role_required,
    user_roles,
)
from aero.templatetags.aero_text import scenario_name
from aero.text import MAX_MESSAGE
from diagnosis import actions, page_panels, presenters, reporting, suggest
from diagnosis.forms import AnswerForm, DeleteSessionForm, NewSessionForm
from diagnosis.models import Report, Session, SessionStatus
from scenarios_admin.models import Scenario


def get_session_for_user(request: HtmxHttpRequest, session_id: UUID) -> Session:
    """404 for unknown or deleted sessions; 403 for users whose role may not see them."""
    session = get_object_or_404(
        Session.objects.visible().select_related("scenario", "scenario_version", "created_by"),
        pk=session_id,
    )
    if not has_role(request.user, VIEW_SESSIONS):
        raise PermissionDenied(_("Your role does not allow viewing sessions."))
    return session


@require_GET
@role_required(VIEW_SESSIONS)
def session_list(request: HtmxHttpRequest) -> HttpResponse:
    status = request.GET.get("status", "")
    if status not in SessionStatus.values:
        status = ""
    return render(
        request,
        "diagnosis/session_list.html",
        {
            **presenters.session_page(status, request.GET.get("before", "")),
            "form": _new_session_form(request),
            "pack_forms": pack_forms(),
            "status": status,
            "status_choices": SessionStatus.choices,
        },
    )


def pack_forms() -> list[tuple[dict[str, str], str]]:
    """The packs' own forms to open a session (a diagnosis from a bundle): label, URL."""
    return [
        (pack.label, reverse(pack.new_session_url))
        for pack in installed_packs()
        if pack.new_session_url is not None
    ]


def _new_session_form(request: HtmxHttpRequest) -> NewSessionForm:
    """Empty, or what a signed-out operator posted, kept for them (aero.drafts); a kept
    message without a scenario comes back with the one it reads like preselected."""
    draft = take_draft(request, reverse("diagnosis:session-create"))
    if draft is None:
        return NewSessionForm()
    scenario: object = draft.get("scenario") or None
    if scenario is None and (fit := suggest.suggestion(str(draft.get("message", "")))):
        scenario = fit.scenario.pk
    return NewSessionForm(initial={"message": draft.get("message", ""), "scenario": scenario})


@require_GET
@role_required(RUN_SESSIONS)
def session_suggest(request: HtmxHttpRequest) -> HttpResponse:
    """The new-incident form's scenario select, re-rendered as the operator types: the
    scenario the message reads like is chosen before the first send (one press opens
    the session). A scenario the operator chose stays chosen; one AERO chose earlier
    (`suggested`) gives way to a better one or to none."""
    text = request.GET.get("message", "")[:MAX_MESSAGE]
    current = request.GET.get("scenario", "")
    own_choice = current not in ("", request.GET.get("suggested", ""))
    fit = None if own_choice or not text.strip() else suggest.suggestion(text)
    form = NewSessionForm(
        initial={"scenario": current if own_choice else (fit and fit.scenario.pk)}
    )
    return render(
        request,
        "diagnosis/_scenario_choice.html",
        {"form": form, "live_fit": fit, "suggested": fit.scenario.pk if fit else ""},
    )


@require_http_methods(["GET", "POST"])
@role_required(RUN_SESSIONS)
def session_create(request: HtmxHttpRequest) -> HttpResponse:
    """Open a session. With no scenario chosen, or one the message fits worse than
    another, the form comes back with AERO's suggestion and the text kept.
    A GET (the address after a sign-in, say) goes to the page with the form."""
    if request.method == "GET":
        return redirect("diagnosis:session-list")
    form = NewSessionForm(request.POST)
    fit = None
    if form.is_valid():
        chosen, text = form.cleaned_data["scenario"], form.cleaned_data["message"]
        if chosen is None:
            fit = suggest.suggestion(text)
            form = _with_scenario(form, fit.scenario if fit else None)
            form.add_error("scenario", _choose_message(fit))
        elif not form.cleaned_data["keep_scenario"] and (fit := suggest.better_fit(chosen, text)):
            form = _with_scenario(form, chosen)
        else:
            try:
                session = actions.do_create_session(request.user, chosen, text)
            except actions.ActionError as exc:
                form.add_error(None, str(exc))
            else:
                return redirect("diagnosis:session-detail", session_id=session.pk)
    return render(
        request,
        "diagnosis/session_list.html",
        {
            **presenters.session_page("", ""),
            "form": form,
            "pack_forms": pack_forms(),
            "fit": fit,
            "status": "",
            "status_choices": SessionStatus.choices,
        },
        status=400,
    )


def _with_scenario(form: NewSessionForm, scenario: Any) -> NewSessionForm:
    """The same form, its text kept, the scenario select set (a bound form shows its data)."""
    data = {key: form.data.get(key, "") for key in ("message",)}
    data["scenario"] = str(scenario.pk) if scenario else ""
    data["keep_scenario"] = ""
    return NewSessionForm(data)


def _choose_message(fit: suggest.Fit | None) -> str:
    if fit is None:
        return gettext("Choose a scenario: the message does not clearly match one.")
    return gettext("Choose a scenario. Suggested from the message: %(name)s.") % {
        "name": scenario_name(fit.scenario)
    }


@require_GET
@role_required(VIEW_SESSIONS)
def session_detail(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    session = get_session_for_user(request, session_id)
    roles = user_roles(request.user)
    mask = presenters.viewer_mask(session, roles=roles)
    reads = presenters.read_session(session)
    events = presenters.latest_events(session, presenters.SESSION_PAGE_EVENTS)
    # What was not sent (a lapsed sign-in, a refused update) comes back to check and send.
    answer = take_draft(request, reverse("diagnosis:session-answer", args=[session.pk]))
    answer_text = (answer or {}).get("message", "")
    update = take_draft(request, reverse("diagnosis:session-update", args=[session.pk]))
    update_text = (update or {}).get("text", "")
    definition = presenters.version_definition(session)

    def context() -> dict[str, Any]:
        built = presenters.session_context(session, None, roles=roles, reads=reads, mask=mask)
        built["answer_form"] = AnswerForm(initial={"message": answer_text})
        built["update_text"] = update_text
        return built

    def keep(panel: str) -> bool:
        """A draft is this viewer's own; a pack's facts panel reads more than the key."""
        if panel == "session-composer":
            return not answer_text and not update_text
        return panel != "session-facts" or pack_for(definition["kind"]).page_panel is None

    # Rendered once for every viewer and the push (page_panels), filled in for this one.
    panels = page_panels.shared(page_panels.PANELS, session, reads, roles, mask, context, keep=keep)
    token = get_token(request)
    return render(
        request,
        "diagnosis/session_detail.html",
        {
            "session": session,
            "definition": definition,
            "question": session.snapshot.get("question"),
            "composer_key": presenters.composer_key(session),
            "viewer_mask": mask,
            "events": mask.events(events) if mask is not None else events,
            "panels": {
                panel.removeprefix("session-"): page_panels.finish(
                    html, reads, csrf_token=token, oob=False
                )
                for panel, html in panels.items()
            },
        },
    )


@require_POST
@role_required(RUN_SESSIONS)
def session_answer(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    session = get_session_for_user(request, session_id)
    form = AnswerForm(request.POST)
    error = ""
    if form.is_valid():
        try:
            actions.do_answer(session.pk, request.user, form.cleaned_data["message"])
        except actions.ActionError as exc:
            error = str(exc)
    else:
        error = str(form.errors["message"][0])
    return _back(request, session, error, "#session-composer", form)


@require_POST
@role_required(RUN_SESSIONS)
def session_cancel(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    session = get_session_for_user(request, session_id)
    error = ""
    try:
        actions.do_cancel(session.pk, request.user, request.POST.get("reason", "").strip())
    except actions.ActionError as exc:
        error = str(exc)
    return _back(request, session, error)


@require_POST
@role_required(RUN_SESSIONS)
def session_close(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """The operator ends the session normally, with a summary (not a cancel)."""
    session = get_session_for_user(request, session_id)
    error = ""
    try:
        actions.do_close(session.pk, request.user, request.POST.get("summary", "").strip())
    except actions.ActionError as exc:
        error = str(exc)
    return _back(request, session, error)


@require_POST
@role_required(RUN_SESSIONS)
def session_update(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """A free-text update from the operator onto the timeline."""
    session = get_session_for_user(request, session_id)
    try:
        actions.do_add_update(session.pk, request.user, request.POST.get("text", ""))
    except actions.ActionError as exc:
        messages.error(request, str(exc))
        keep_draft(request, request.path, request.POST)  # the page shows it again
    return redirect("diagnosis:session-detail", session_id=session.pk)


@require_POST
@role_required(RUN_SESSIONS)
def session_correct(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """Correct one extracted fact; the agent applies it and re-runs the rules."""
    session = get_session_for_user(request, session_id)
    try:
        actions.do_correct_fact(
            session.pk, request.user, request.POST.get("field", ""), request.POST.get("value", "")
        )
    except actions.ActionError as exc:
        messages.error(request, str(exc))
    return redirect("diagnosis:session-detail", session_id=session.pk)


@require_POST
@role_required(RUN_SESSIONS)
def session_switch(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """Reopen the incident under the scenario the message fits better (text carried over)."""
    session = get_session_for_user(request, session_id)
    scenario = Scenario.objects.filter(
        slug=request.POST.get("scenario", ""), is_active=True
    ).first()
    if scenario is None:
        messages.error(request, gettext("Choose a scenario to switch to."))
        return redirect("diagnosis:session-detail", session_id=session.pk)
    try:
        new = actions.do_switch_scenario(session.pk, request.user, scenario)
    except actions.ActionError as exc:
        messages.error(request, str(exc))
        return redirect("diagnosis:session-detail", session_id=session.pk)
    messages.success(
        request,
        gettext("Reopened as %(name)s with the same message; the earlier session was closed.")
        % {"name": scenario_name(scenario)},
    )
    return redirect("diagnosis:session-detail", session_id=new.pk)


@require_POST
@role_required(RUN_SESSIONS)
def session_retry(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    session = get_session_for_user(request, session_id)
    error = ""
    try:
        actions.do_retry(session.pk, request.user)
    except actions.ActionError as exc:
        error = str(exc)
    return _back(request, session, error)


@require_http_methods(["GET", "POST"])
@role_required(DELETE_SESSIONS)
def session_delete(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """Admins soft-delete a session: a confirmation page (GET) with the consequences and
    a required reason, then the delete (POST)."""
    session = get_session_for_user(request, session_id)
    form = DeleteSessionForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            actions.do_delete_session(session.pk, request.user, form.cleaned_data["reason"])
        except actions.ActionError as exc:
            form.add_error(None, str(exc))
        else:
            messages.success(
                request,
                _(
                    "Session “%(title)s” was deleted. Its events and audit entries are "
                    "kept; auditors can still replay it."
                )
                % {"title": session.title},
            )
            return redirect("diagnosis:session-list")
    return render(
        request,
        "diagnosis/session_delete.html",
        {
            "session": session,
            "form": form,
            "open_approvals": session.approvals.filter(
                status__in=["pending", "confirming"]
            ).count(),
        },
        status=400 if form.errors else 200,
    )


def _back(
    request: HtmxHttpRequest, session: Session, error: str, partial: str = "", form: Any = None
) -> HttpResponse:
    """After a POST: htmx gets the re-rendered partial (with the error); a plain form
    post is redirected back to the page with the error as a message."""
    if request.htmx and partial:
        session.refresh_from_db()
        context = presenters.session_context(session, request.user)
        context["answer_form"] = form if (error and form is not None) else AnswerForm()
        context["composer_error"] = error
        return render(
            request,
            "diagnosis/session_detail.html" + partial,
            context,
            status=400 if error else 200,
        )
    if error:
        messages.error(request, error)
    return redirect("diagnosis:session-detail", session_id=session.pk)


@require_GET
@role_required(VIEW_SESSIONS)
def session_events(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """The whole timeline, 200 events a page (keyset by seq): readable without JS.
    `after=N` pages forward from seq N; `before=N` shows the 200 events before seq N (the
    session page's "earlier events" link: with htmx, only those rows, put at the top of
    the page's timeline, and the link moved to the page before them)."""
    session = get_session_for_user(request, session_id)
    try:
        after = max(0, int(request.GET.get("after", "0")))
    except ValueError:
        after = 0
    try:
        before = max(1, int(request.GET["before"])) if "before" in request.GET else None
    except ValueError:
        before = None
    events = presenters.timeline(session, after=after, before=before)
    if before is not None and events:
        after = events[0].seq - 1
    mask = presenters.viewer_mask(session, request.user)
    if mask is not None:
        events = mask.events(events)
    template = "diagnosis/session_events.html"
    if request.htmx and request.htmx.target == "timeline-list" and before is not None:
        template += "#timeline-older"
    elif request.htmx:
        template += "#timeline-events"
    return render(
        request,
        template,
        {
            "session": session,
            # the timeline names fields with the scenario's labels
            "definition": presenters.version_definition(session),
            "events": events,
            "after": after,
            "next_after": events[-1].seq if len(events) == presenters.TIMELINE_PAGE else None,
        },
    )


@require_GET
@role_required(VIEW_SESSIONS)
def session_report(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    session = get_session_for_user(request, session_id)
    report = Report.objects.filter(session=session).first()
    # In the reader's language, or the one asked for (?lang=zh|en), worded from the facts.
    asked = request.GET.get("lang", "")
    markdown = reporting.session_report(session, asked if asked in ("zh", "en") else None)
    if report is None or markdown is None:
        # Not "nothing at this address": the session is there, its report comes later.
        context = {
            "reason": _("The report is written once every action has been decided."),
            "back": reverse("diagnosis:session-detail", args=[session.pk]),
        }
        return render(request, "404.html", context, status=404)
    audit(
        "report.exported",
        obj=report,
        actor=request.user,
        session_id=session.pk,
        detail={"format": "markdown", "characters": len(markdown)},
    )
    mask = presenters.viewer_mask(session, request.user)
    markdown = mask.text(markdown) if mask is not None else markdown
    response = HttpResponse(markdown, content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="aero-report-{session.pk}.md"'
    return response
