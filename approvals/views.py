from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from aero.http import HtmxHttpRequest
from aero.roles import DECIDE_APPROVALS, RUN_SESSIONS, role_required
from approvals import presenters
from approvals.actions import do_decide, do_resolve_todo
from approvals.forms import ResolveTodoForm
from approvals.models import Approval, ManualTodo
from diagnosis import presenters as session_presenters
from diagnosis.actions import ActionError


@require_GET
@role_required(DECIDE_APPROVALS)
def approval_queue(request: HtmxHttpRequest) -> HttpResponse:
    context = presenters.queue_context(
        request.user,
        request.GET.get("risk", ""),
        request.GET.get("scenario", ""),
        request.GET.get("after", ""),
    )
    template = "approvals/queue.html"
    if request.htmx:
        template += "#approval-queue"
    return render(request, template, context)


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
    if request.htmx:
        if from_queue:
            context = presenters.queue_context(request.user)
            context["queue_error"] = error
            return render(
                request,
                "approvals/queue.html#approval-queue",
                context,
                status=400 if error else 200,
            )
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
    if from_queue:
        return redirect("approvals:queue")
    return redirect("diagnosis:session-detail", session_id=approval.session_id)


@require_GET
@role_required(RUN_SESSIONS)
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
            do_resolve_todo(todo.pk, request.user, form.cleaned_data["note"])
        except ActionError as exc:
            messages.error(request, str(exc))
        else:
            messages.success(request, _("To-do resolved."))
    return redirect("approvals:todo-list")
