from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django.contrib import messages
from django.contrib.messages import get_messages
from django.http import Http404, HttpResponse
from django.middleware.csrf import get_token
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from aero import http
from aero.http import HtmxHttpRequest
from aero.i18n import NOTIFY_SESSION_KEY
from aero.models import UserPreference
from aero.roles import DECIDE_APPROVALS, RUN_SESSIONS, VIEW_TODOS, role_required, user_roles
from approvals import page_cache, presenters
from approvals.actions import do_decide, do_decide_r1_batch, do_edit_args, do_resolve_todo
from approvals.cards import CSRF_MARK
from approvals.forms import ResolveTodoForm
from approvals.models import Approval, ManualTodo
from diagnosis import presenters as session_presenters
from diagnosis.actions import ActionError
from diagnosis.models import Session


@require_GET
@role_required(DECIDE_APPROVALS)
def approval_queue(request: HtmxHttpRequest) -> HttpResponse:
    """Rendered once per queue change for everyone who asks for the same path with the
    same roles, language and time zone (approvals.page_cache); the request fills in its
    CSRF token, the user's name and the deadlines."""
    notify_on = bool(request.session.get(NOTIFY_SESSION_KEY))
    template = "approvals/queue.html"
    if request.htmx:
        # The filter form swaps the live block (socket URL included); other callers
        # ask for the list alone.
        live = request.htmx.target == "approval-live"
        template += "#approval-live" if live else "#approval-queue"
    csrf_token = http.csrf_token(request)
    user = request.user
    if len(get_messages(request)):
        # A message is this request's own (and read once): the page is rendered for it.
        context = _queue_page(request, csrf_token, marks=False)
        context["notify_on"] = notify_on
        return render(request, template, context)
    key = page_cache.page_key(request, template, user_roles(user), notify_on)
    page = page_cache.find(key)
    if page is None:
        context = _queue_page(request, CSRF_MARK, marks=True)
        context.update(
            notify_on=notify_on,
            csrf_token=CSRF_MARK,
            user=page_cache.MarkedUser(user),
            messages=(),
        )
        page = page_cache.keep(key, render_to_string(template, context, request=request))
    return HttpResponse(page_cache.body(page, csrf_token, user.get_username()))


@require_GET
@role_required(DECIDE_APPROVALS)
def approval_edit_form(request: HtmxHttpRequest, approval_id: int) -> HttpResponse:
    """A queue card's argument editor, loaded when it is opened (the queue's page folds
    fifty): the open approval's form, cached under the queue's stamp as the page is."""

    def context() -> tuple[str, dict[str, Any]]:
        approval = get_object_or_404(
            presenters.open_approvals().select_related("tool_call"), pk=approval_id
        )
        if not approval.editable_args:
            raise Http404
        risk, scenario = presenters.clean_filters(
            request.GET.get("risk", ""), request.GET.get("scenario", "")
        )
        only = presenters.clean_incident(request.GET.get("incident", ""))
        return "approvals/_edit_args_form.html", {
            "a": approval,
            "target": "approval-queue",
            "next": "queue",
            "risk": risk,
            "scenario": scenario,
            "incident": str(only) if only is not None else "",
        }

    return _cached_part(request, "edit-form", context)


@require_GET
@role_required(DECIDE_APPROVALS)
def approval_incident_map(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """A queue card's impact map, loaded when its folded panel is opened (ten maps were
    a quarter of the page), cached under the queue's stamp as the page is."""

    def context() -> tuple[str, dict[str, Any]]:
        session = get_object_or_404(Session.objects.visible(), pk=session_id)
        found = presenters.incident_map(session)
        if found is None:
            raise Http404
        return found["map"]["template"], found

    return _cached_part(request, "incident-map", context)


def _cached_part(
    request: HtmxHttpRequest, variant: str, context: Callable[[], tuple[str, dict[str, Any]]]
) -> HttpResponse:
    """A part rendered once per queue change for everyone asking for the same path with
    the same roles and language; the request fills in its CSRF token. A part kept under
    the queue's current stamp was found (open, visible) when it was rendered and nothing
    changed since: `context` (template, context; Http404 for what is not there) runs
    only when none is kept. The role check is the view's, on every request."""
    user = request.user
    key = page_cache.page_key(request, variant, user_roles(user), False)
    page = page_cache.find(key)
    if page is None:
        template, found = context()
        page = page_cache.keep(
            key, render_to_string(template, {**found, "csrf_token": CSRF_MARK}, request=request)
        )
    return HttpResponse(page_cache.body(page, http.csrf_token(request), user.get_username()))


def _queue_page(request: HtmxHttpRequest, csrf_token: str, *, marks: bool) -> dict[str, Any]:
    context = presenters.queue_context(
        request.user,
        request.GET.get("risk", ""),
        request.GET.get("scenario", ""),
        request.GET.get("after", ""),
        incident=request.GET.get("incident", ""),
        csrf_token=csrf_token,
        marks=marks,
    )
    if not context["risk"] and not context["scenario"] and not context["incident"]:
        # The nav's open count is this page's own: no second count query.
        context["pending_count"] = context["open_count"]
    return context


@require_POST
@role_required(DECIDE_APPROVALS)
def approval_notify(request: HtmxHttpRequest) -> HttpResponse:
    """Turn the approver's R2/R3 notification and sound on or off, remembered on their
    preference (and in the session, which the queue page reads)."""
    on = request.POST.get("on") == "1"
    user = request.user
    assert user.is_authenticated  # role_required let only signed-in users in
    UserPreference.objects.update_or_create(user=user, defaults={"notify_risky": on})
    request.session[NOTIFY_SESSION_KEY] = on
    if request.headers.get("X-Requested-With") == "fetch":
        return HttpResponse(status=204)
    return redirect("approvals:queue")


@require_POST
@role_required(DECIDE_APPROVALS)
def approval_decide(request: HtmxHttpRequest, approval_id: int) -> HttpResponse:
    approval = get_object_or_404(Approval.objects.select_related("session"), pk=approval_id)
    error = ""
    try:
        do_decide(
            approval.pk,
            request.user,
            request.POST.get("decision", ""),
            request.POST.get("reason", ""),
            digest=request.POST.get("digest", ""),
        )
    except ActionError as exc:
        error = str(exc)
    from_queue = request.POST.get("next") == "queue" or request.GET.get("next") == "queue"
    return _answer_after(request, approval, error, from_queue)


def _answer_after(
    request: HtmxHttpRequest, approval: Approval, error: str, from_queue: bool, success: str = ""
) -> HttpResponse:
    """What a decision or an argument edit answers: the queue or the session's actions
    panel (htmx, with the error on the card), else a redirect with a message."""
    if request.htmx:
        if from_queue:
            return _queue_after_decision(request, error, approval.pk)
        approval.session.refresh_from_db()
        context = session_presenters.session_context(approval.session, request.user)
        context["action_error"] = error
        return render(
            request,
            "diagnosis/session_detail.html#session-actions",
            context,
            status=400 if error else 200,
        )
    if error:
        messages.error(request, error)
    elif success:
        messages.success(request, success)
    if from_queue:
        return redirect(_queue_url(request))
    return redirect("diagnosis:session-detail", session_id=approval.session_id)


@require_POST
@role_required(DECIDE_APPROVALS)
def approval_edit_args(request: HtmxHttpRequest, approval_id: int) -> HttpResponse:
    """Correct an action's arguments before deciding it (re-digested, re-checked)."""
    approval = get_object_or_404(
        Approval.objects.select_related("session", "tool_call"), pk=approval_id
    )
    error = ""
    try:
        do_edit_args(
            approval.pk,
            request.user,
            {name: request.POST.get(f"arg-{name}", "") for name in approval.editable_args},
            request.POST.get("edit_reason", ""),
            digest=request.POST.get("digest", ""),
        )
    except ActionError as exc:
        error = str(exc)
    return _answer_after(
        request,
        approval,
        error,
        request.POST.get("next") == "queue",
        gettext("Arguments changed: decide the action as it reads now."),
    )


@require_POST
@role_required(DECIDE_APPROVALS)
def approval_bulk_decide(request: HtmxHttpRequest, session_id: UUID) -> HttpResponse:
    """Approve or reject all of one incident's R1 actions the approver was shown."""
    session = get_object_or_404(Session.objects.visible(), pk=session_id)
    error = ""
    try:
        shown = [_pair(value) for value in request.POST.getlist("approval")]
        decided = do_decide_r1_batch(
            session.pk,
            request.user,
            request.POST.get("decision", ""),
            request.POST.get("reason", ""),
            shown,
        )
    except ActionError as exc:
        error = str(exc)
    if request.htmx:
        return _queue_after_decision(request, error, None)
    if error:
        messages.error(request, error)
    else:
        messages.success(
            request,
            ngettext("%d action decided.", "%d actions decided.", len(decided)) % len(decided),
        )
    return redirect(_queue_url(request))


def _pair(value: str) -> tuple[int, str]:
    pk, _, digest = value.partition(":")
    if not pk.isdigit() or not digest:
        raise ActionError("This batch does not say which requests it is for; reload the queue.")
    return int(pk), digest


def _queue_after_decision(
    request: HtmxHttpRequest, error: str, approval_id: int | None
) -> HttpResponse:
    """The queue list with the viewer's filters (sent with the form), the error on the
    card it is about when that card is still listed, else above the list."""
    context = presenters.queue_context(
        request.user,
        request.POST.get("risk", ""),
        request.POST.get("scenario", ""),
        incident=request.POST.get("incident", ""),
        csrf_token=get_token(request),
        error=error,
        error_for=approval_id,
    )
    context["error_shown_on_card"] = approval_id in context["shown"]
    return render(
        request, "approvals/queue.html#approval-queue", context, status=400 if error else 200
    )


def _queue_url(request: HtmxHttpRequest) -> str:
    risk, scenario = presenters.clean_filters(
        request.POST.get("risk", ""), request.POST.get("scenario", "")
    )
    incident = presenters.clean_incident(request.POST.get("incident", ""))
    query = urlencode(
        {
            k: v
            for k, v in (("risk", risk), ("scenario", scenario), ("incident", str(incident or "")))
            if v
        }
    )
    return reverse("approvals:queue") + (f"?{query}" if query else "")


@require_GET
@role_required(VIEW_TODOS)
def todo_list(request: HtmxHttpRequest) -> HttpResponse:
    return render(
        request,
        "approvals/todos.html",
        {**presenters.todo_context(request.GET.get("after", "")), "form": ResolveTodoForm()},
    )


@require_POST
@role_required(RUN_SESSIONS)
def todo_resolve(request: HtmxHttpRequest, todo_id: int) -> HttpResponse:
    todo = get_object_or_404(ManualTodo, pk=todo_id)
    form = ResolveTodoForm(request.POST)
    if not form.is_valid():
        messages.error(request, str(form.errors["note"][0]))
    else:
        try:
            do_resolve_todo(
                todo.pk,
                request.user,
                form.cleaned_data["note"],
                in_force=request.POST.get("outcome") == "in_force",
            )
        except ActionError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, _("To-do resolved."))
    return redirect("approvals:todo-list")
