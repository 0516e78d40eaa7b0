"""The session page's reads as statements compiled once per connection (aero.compiled):
building and compiling a queryset cost about as much CPU as the page's panels once
those are shared (diagnosis.page_panels), and the shapes never change, only the session.

The calls and approvals are read with the names of the users they show in the same row
(as select_related would, which a compiled statement cannot): each user is built from
its id and name alone, which is all the panels show of them."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib.auth import get_user_model
from django.db import router
from django.db.models import Model, Q

from aero.compiled import Arg, Compiled
from diagnosis.eventlog.names import REPORT_READY
from diagnosis.models import Event, Session, ToolCall
from scenarios_admin.definition import BUDGET_TOOL


def _attnames(model: type[Model]) -> list[str]:
    return [f.attname for f in model._meta.concrete_fields]


def _session_arg(model: type[Model]) -> Arg:
    return Arg(0, model._meta.get_field("session"))


def _approval_model() -> Any:
    # The approvals app owns Approval; diagnosis names it, never imports it.
    return apps.get_model("approvals", "Approval")


# The users an approval shows, by the column holding them.
APPROVAL_USERS = ("first_approved_by", "approver", "edited_by")

_calls: Compiled[ToolCall] = Compiled(
    ToolCall,
    lambda: (
        # A request to continue past the model budget is decided on the page too.
        ToolCall.objects.filter(
            Q(is_action=True) | Q(tool_name=BUDGET_TOOL), session_id=_session_arg(ToolCall)
        )
        .order_by("position", "id")
        .values_list(*_attnames(ToolCall), "decided_by__username")
    ),
)
_approvals: Compiled[Any] = Compiled(
    "approvals.Approval",
    lambda: (
        _approval_model()
        .objects.filter(session_id=_session_arg(_approval_model()))
        .order_by("-created_at", "-id")
        .values_list(
            *_attnames(_approval_model()), *(f"{name}__username" for name in APPROVAL_USERS)
        )
    ),
)
_report: Compiled[Event] = Compiled(
    Event,
    lambda: (
        Event.objects.filter(session_id=_session_arg(Event), type=REPORT_READY)
        .order_by("-seq")
        .values_list("payload", flat=True)[:1]
    ),
)
_latest: dict[int, Compiled[Event]] = {}


def _user(alias: str, pk: Any, name: str | None) -> Any:
    """A user as the panels show one (its name), or None."""
    if pk is None:
        return None
    return get_user_model().from_db(alias, ["id", "username"], (pk, name))


def calls(session_id: Any) -> list[ToolCall]:
    """The session's action calls (and budget requests) in order, with who decided."""
    alias = router.db_for_read(ToolCall)
    names = _attnames(ToolCall)
    found = []
    for row in _calls.rows(session_id):
        call = ToolCall.from_db(alias, names, row[:-1])
        call.decided_by = _user(alias, call.decided_by_id, row[-1])
        found.append(call)
    return found


def approvals(session_id: Any, calls: list[ToolCall]) -> list[Any]:
    """The session's approvals, with their users and their calls (from `calls`, read
    on their own when not there)."""
    model = _approval_model()
    alias = router.db_for_read(model)
    names = _attnames(model)
    by_id = {call.pk: call for call in calls}
    found = []
    for row in _approvals.rows(session_id):
        approval: Any = model.from_db(alias, names, row[: len(names)])
        for name, username in zip(APPROVAL_USERS, row[len(names) :], strict=True):
            setattr(approval, name, _user(alias, getattr(approval, f"{name}_id"), username))
        call = by_id.get(approval.tool_call_id)
        if call is not None:
            approval.tool_call = call
        found.append(approval)
    return found


def report(session_id: Any) -> dict[str, Any] | None:
    """The last `report.ready` payload of the session, or None."""
    found: dict[str, Any] | None = _report.first(session_id)
    return found


def latest_events(session: Session, limit: int) -> list[Event]:
    """The newest `limit` events up to the session's last_seq, oldest first."""
    read = _latest.get(limit)
    if read is None:
        read = _latest.setdefault(
            limit,
            Compiled(
                Event,
                lambda: Event.objects.filter(
                    session_id=_session_arg(Event), seq__lte=Arg(1, Event._meta.get_field("seq"))
                ).order_by("-seq")[:limit],
            ),
        )
    return list(reversed(list(read.rows(session.pk, session.last_seq))))
