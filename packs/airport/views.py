"""The airport status board: every runway, taxiway and stand with the restrictions in
force on it, and an operator's request to lift one (decided in the approval queue)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext as _
from django.views.decorators.http import require_GET, require_POST

from aero.http import HtmxHttpRequest
from aero.roles import LIFT_RESTRICTIONS, VIEW_SESSIONS, role_required, user_roles
from diagnosis import actions, lifts
from diagnosis.forms import LiftForm
from packs.airport.models import Restriction
from packs.airport.pages import board_page


@require_GET
@role_required(VIEW_SESSIONS)
def board(request: HtmxHttpRequest) -> HttpResponse:
    context = board_page(user_roles(request.user))
    return render(request, "airport/board.html", {**context, "form": LiftForm()})


@require_POST
@role_required(LIFT_RESTRICTIONS)
def restriction_lift(request: HtmxHttpRequest, restriction_id: int) -> HttpResponse:
    restriction = get_object_or_404(Restriction, pk=restriction_id)
    form = LiftForm(request.POST)
    if not form.is_valid():
        messages.error(request, str(form.errors["note"][0]))
        return redirect("airport:board")
    try:
        lifts.do_request_lift(restriction.pk, request.user, form.cleaned_data["note"])
    except actions.ActionError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            _(
                "Lift of %(restriction)s requested: it stays in force until an approver "
                "approves and confirms the lift (R2)."
            )
            % {"restriction": restriction},
        )
    return redirect("airport:board")
