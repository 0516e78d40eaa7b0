"""REST /api/v1 (django-ninja). Every state change goes through the same do_*
actions as the pages: the API adds authentication, JSON and idempotency, never policy."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

import pydantic
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import NinjaAPI, Query, Status
from ninja.errors import ValidationError
from ninja.openapi.docs import Swagger
from ninja.operation import Operation

from aero.packs import installed_packs
from aero.roles import DECIDE_APPROVALS, VIEW_SESSIONS
from api import bundles, idempotency, pagination, schemas
from api.auth import RUN, TokenAuth
from api.errors import (
    PROBLEM,
    READ_ERRORS,
    WRITE_ERRORS,
    ApiError,
    ErrorOut,
    install_handlers,
    problem_response,
)
from api.history import early as early_history_router
from api.history import router as history_router
from api.idempotency import REPLAYED, request_hash, run_once
from api.presenters import (
    approval_out,
    envelope,
    run_out,
    session_out,
    viewer_mask,
    viewer_roles,
)
from api.skills import router as skills_router
from api.strict import StrictRouter
from api.tools import router as tools_router
from approvals.actions import APPROVE, CONFIRM, REJECT, do_decide
from approvals.models import OPEN_STATUSES, Approval
from diagnosis import actions
from diagnosis.actions import ActionError
from diagnosis.agent_tree import read_tree
from diagnosis.models import Event, Session, SessionStatus
from scenarios_admin.models import Scenario

TIMELINE_MAX = 200
LIST_MAX = 100  # rendering is not involved, but one page stays one small query

# The operations that create something: a 201 says where it is.
CREATES = ("createSession", "createKnowledgeItem")
HEADERS = {
    "X-Request-ID": "This request's id: in every problem body and the server's log lines.",
}


class AeroApi(NinjaAPI):
    """Readable operationIds (`createSession`, not the module path) and a schema that
    says what the API answers: errors as RFC 9457 problems, the request id on every
    response, `Location` on a 201 and the replay marker of an idempotent retry."""

    def get_openapi_operation_id(self, operation: Operation) -> str:
        first, *rest = operation.view_func.__name__.split("_")
        return first + "".join(word.capitalize() for word in rest)

    def get_openapi_schema(self, **kwargs: Any) -> Any:
        schema = super().get_openapi_schema(**kwargs)
        for item in schema["paths"].values():
            for operation in item.values():
                for status, response in operation.get("responses", {}).items():
                    headers = response.setdefault("headers", {})
                    for name, text in HEADERS.items():
                        headers[name] = {"description": text, "schema": {"type": "string"}}
                    if int(status) >= 400 and "application/json" in response.get("content", {}):
                        response["content"] = {PROBLEM: response["content"]["application/json"]}
                    if operation.get("operationId") in CREATES and int(status) == 201:
                        headers["Location"] = {
                            "description": "The URL of what was created.",
                            "schema": {"type": "string"},
                            "required": True,
                        }
                        headers[REPLAYED] = {
                            "description": '"true" when this answers a retry with the same'
                            " Idempotency-Key (the first response, replayed).",
                            "schema": {"type": "string", "enum": ["true"]},
                        }
        return schema


api = AeroApi(
    title="AERO API",
    version="1",
    description=(
        "Incident sessions, their event log and approvals, for machines. Authenticate with "
        "a personal API token (`Authorization: Bearer aero_…`), created under /api/tokens/. "
        "Errors are RFC 9457 problems (`application/problem+json`: type, title, status, "
        "detail, instance, plus `code` and `request_id`). Lists page with `limit` and an "
        "opaque `cursor` (pass the page's `next_cursor`)."
    ),
    urls_namespace="api",
    # Served from django-ninja's own static files (ninja is in INSTALLED_APPS): no CDN.
    docs=Swagger(settings={"persistAuthorization": True}),
)
install_handlers(api)
READ = TokenAuth(VIEW_SESSIONS, "view sessions")
DECIDE = TokenAuth(DECIDE_APPROVALS, "decide approvals")
sessions = StrictRouter(tags=["sessions"])
approvals = StrictRouter(tags=["approvals"])


def _session(session_id: UUID) -> Session:
    session = (
        Session.objects.visible()
        .select_related("scenario", "scenario_version", "created_by")
        .filter(pk=session_id)
        .first()
    )
    if session is None:
        raise ApiError(404, "not_found", f"No session {session_id}.")
    return session


def _refused(exc: ActionError) -> ApiError:
    return ApiError(409, "action_refused", str(exc))


def _snapshot(session_id: UUID, request: HttpRequest) -> dict[str, Any]:
    session = (
        Session.objects.select_related("scenario", "scenario_version", "created_by")
        .annotate(
            open_approvals=Count("approvals", filter=Q(approvals__status__in=OPEN_STATUSES)),
        )
        .get(pk=session_id)
    )
    return session_out(session, viewer_mask(session.pk, request))


# --- sessions -------------------------------------------------------------------------


# The JSON body and the multipart bundle form, both on the one create operation: ninja
# documents one body type per operation, so both are declared here and read by the view.
JSON_TYPES = ("application/json", "")  # "": today's clients that send no Content-Type
CREATE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": schemas.SessionIn.model_json_schema()},
            "multipart/form-data": {"schema": bundles.form_schema()},
        },
    }
}


@sessions.post(
    "",
    auth=RUN,
    response={201: schemas.SessionCreated, 415: ErrorOut, **WRITE_ERRORS},
    summary="Open an incident session (JSON), or an IT diagnosis from a bundle (multipart)",
    openapi_extra=CREATE_BODY,
)
def create_session(
    request: HttpRequest,
    response: HttpResponse,
    idempotency_key: str | None = idempotency.key_header(),
) -> Any:
    """`application/json`: a scenario's slug and the incident's words. `multipart/form-data`:
    an incident bundle (`bundle`, a .zip or .tar.gz) with `title`, `description`,
    `problem_type`, `preferred_mode` and where the evidence comes from (`sources`,
    `metrics_source`); with `sources=system` the bundle may be left out (the description
    and `since`/`until` are the incident). A bad bundle is a 422 naming its file, line and
    field, and nothing is created. Either with Idempotency-Key: the same key with another
    body is refused."""
    media = request.content_type or ""
    if media == "multipart/form-data":
        status, body, replayed = bundles.create_from_bundle(request, idempotency_key)
    elif media in JSON_TYPES or media.endswith("+json"):
        status, body, replayed = _create_from_json(request, idempotency_key)
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type {media} is not accepted here: send application/json "
            "(problem_type, description) or multipart/form-data (an incident bundle).",
        )
    if replayed:
        idempotency.mark_replayed(request, response)
    if status == 201:
        response["Location"] = reverse("api:get_session", kwargs={"session_id": body["session_id"]})
    return Status(status, body)


def _json_body(request: HttpRequest) -> schemas.SessionIn:
    """The JSON body, refused as ninja refuses a body it reads itself: 400 if it is not
    JSON, 422 naming `body.payload.<field>` if it is not a SessionIn."""
    data: Any = None
    if request.body:
        try:
            data = json.loads(request.body)
        except ValueError as exc:
            raise ApiError(400, "bad_request", "Cannot parse request body") from exc
    if data is None:
        raise ValidationError([{"loc": ("body", "payload"), "msg": "Field required"}])
    try:
        return schemas.SessionIn.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ValidationError(
            [{"loc": ("body", "payload", *e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        ) from exc


def _create_from_json(
    request: HttpRequest, idempotency_key: str | None
) -> tuple[int, dict[str, Any], bool]:
    payload = _json_body(request)
    sent = payload.model_dump()

    def create() -> tuple[int, dict[str, Any]]:
        scenario = Scenario.objects.filter(slug=payload.problem_type, is_active=True).first()
        if scenario is None:
            # 404: the body is well-formed, the scenario it names does not exist.
            raise ApiError(
                404, "unknown_problem_type", f"No active scenario {payload.problem_type!r}."
            )
        try:
            session = actions.do_create_session(
                request.user, scenario, payload.description, producer="api"
            )
        except ActionError as exc:
            raise _refused(exc) from exc
        return 201, {"session_id": str(session.pk), "status": session.status}

    return run_once(request.user, idempotency_key, request_hash("POST", request.path, sent), create)


@sessions.get("", auth=READ, response={200: schemas.SessionPage, **READ_ERRORS})
def list_sessions(
    request: HttpRequest,
    status: Literal["", *SessionStatus.values] = "",  # type: ignore[valid-type]
    problem_type: str = Query("", max_length=64, pattern=r"^[-a-zA-Z0-9_]*$"),
    limit: int = Query(50, ge=1, le=LIST_MAX),
    cursor: str = pagination.cursor_query(),
) -> Any:
    """Sessions newest first, as on the sessions page (deleted ones excluded)."""
    sessions = Session.objects.visible().select_related("scenario", "created_by")
    if status:
        sessions = sessions.filter(status=status)
    if problem_type:
        sessions = sessions.filter(scenario__slug=problem_type)
    if cursor:
        after = pagination.decode("sessions", cursor)
        try:
            moment, last = datetime.fromisoformat(after["t"]), UUID(after["id"])
        except (KeyError, TypeError, ValueError):
            raise ApiError(404, "invalid_cursor", "No such page: start again.") from None
        sessions = sessions.filter(Q(created_at__lt=moment) | Q(created_at=moment, pk__lt=last))
    page = list(sessions.order_by("-created_at", "-id")[: limit + 1])
    shown = page[:limit]
    return {
        "sessions": [
            {
                "id": s.pk,
                "title": s.title,
                "status": s.status,
                "problem_type": s.scenario.slug,
                "created_by": s.created_by.get_username(),
                "created_at": s.created_at,
                "ended_at": s.ended_at,
                "last_seq": s.last_seq,
            }
            for s in shown
        ],
        "next_cursor": (
            pagination.encode(
                "sessions", {"t": shown[-1].created_at.isoformat(), "id": str(shown[-1].pk)}
            )
            if len(page) > limit
            else None
        ),
    }


@sessions.get("/{session_id}", auth=READ, response={200: schemas.SessionOut, **READ_ERRORS})
def get_session(request: HttpRequest, session_id: UUID) -> Any:
    """The session's current snapshot, state and usage."""
    _session(session_id)
    return _snapshot(session_id, request)


ACT_ONCE = "Retry safely: the same key and body act once (24 h), then answer the session."


def _act_once(
    request: HttpRequest,
    response: HttpResponse,
    session_id: UUID,
    key: str | None,
    sent: dict[str, Any],
    act: Any,
) -> Any:
    """Run `act` at most once per Idempotency-Key (a retry with the key does not act
    again) and answer with the session as it is now."""

    def run() -> tuple[int, dict[str, Any]]:
        act()
        return 200, {"session_id": str(session_id)}

    idempotency.answer_once(request, response, key, sent, run)
    return _snapshot(session_id, request)


@sessions.post("/{session_id}/cancel", auth=RUN, response={200: schemas.SessionOut, **WRITE_ERRORS})
def cancel_session(
    request: HttpRequest,
    response: HttpResponse,
    session_id: UUID,
    payload: schemas.CancelIn,
    idempotency_key: str | None = idempotency.key_header(ACT_ONCE),
) -> Any:
    """Cancel the session (its open approvals are closed undecided, with events). A
    session that is already canceled answers as it is, and nothing more is written; one
    that ended otherwise is a 409."""
    _session(session_id)

    def cancel() -> None:
        try:
            actions.do_cancel(session_id, request.user, payload.reason, producer="api")
        except ActionError as exc:
            # Already canceled (by an earlier try, or a concurrent one): what was asked is so.
            status = Session.objects.filter(pk=session_id).values_list("status", flat=True)
            if status.first() != SessionStatus.CANCELED:
                raise _refused(exc) from exc

    return _act_once(request, response, session_id, idempotency_key, payload.model_dump(), cancel)


@sessions.post("/{session_id}/resume", auth=RUN, response={200: schemas.SessionOut, **WRITE_ERRORS})
def resume_session(
    request: HttpRequest,
    response: HttpResponse,
    session_id: UUID,
    idempotency_key: str | None = idempotency.key_header(ACT_ONCE),
) -> Any:
    """Re-queue a failed session: the agent resumes from its last checkpoint. With an
    Idempotency-Key a retry does not queue it again; without one, resuming a session
    that is no longer failed is a 409."""
    _session(session_id)

    def resume() -> None:
        try:
            actions.do_retry(session_id, request.user, producer="api")
        except ActionError as exc:
            raise _refused(exc) from exc

    return _act_once(request, response, session_id, idempotency_key, {}, resume)


@sessions.post("/{session_id}/answer", auth=RUN, response={200: schemas.SessionOut, **WRITE_ERRORS})
def answer_session(request: HttpRequest, session_id: UUID, payload: schemas.AnswerIn) -> Any:
    """Answer the question the agent asked (snapshot.question)."""
    _session(session_id)
    try:
        actions.do_answer(session_id, request.user, payload.message, producer="api")
    except ActionError as exc:
        raise _refused(exc) from exc
    return _snapshot(session_id, request)


@sessions.get(
    "/{session_id}/timeline", auth=READ, response={200: schemas.TimelineOut, **READ_ERRORS}
)
def timeline(
    request: HttpRequest,
    session_id: UUID,
    from_seq: int | None = Query(
        None, ge=1, le=2**53, description="First seq to return (a cursor, when given, wins)."
    ),
    limit: int = Query(100, ge=1, le=TIMELINE_MAX),
    cursor: str = pagination.cursor_query(),
) -> Any:
    """Events in seq order from `from_seq` (or the cursor's position; the first event
    when neither is given), at most `limit` of them (keyset on seq)."""
    session = _session(session_id)
    first = from_seq or 1
    if cursor:
        position = pagination.decode(f"timeline:{session.pk}", cursor).get("seq")
        if not isinstance(position, int) or position < 1:
            raise ApiError(404, "invalid_cursor", "No such page: start again.")
        first = position
    events = list(
        Event.objects.filter(session_id=session.pk, seq__gte=first).order_by("seq")[: limit + 1]
    )
    more = len(events) > limit
    events = events[:limit]
    mask = viewer_mask(session.pk, request)
    return {
        "session_id": session.pk,
        "last_seq": session.last_seq,
        "events": [envelope(event, mask) for event in events],
        "next_cursor": (
            pagination.encode(f"timeline:{session.pk}", {"seq": events[-1].seq + 1})
            if more
            else None
        ),
    }


@sessions.get(
    "/{session_id}/agent-tree", auth=READ, response={200: schemas.AgentTreeOut, **READ_ERRORS}
)
def agent_tree(request: HttpRequest, session_id: UUID) -> Any:
    """Every agent run of the session as a tree (a job's root run and the runs under it),
    at most agent_tree.MAX_RUNS of them: no cursor, a tree is not paged."""
    session = _session(session_id)
    tree = read_tree(session.pk, viewer_mask(session.pk, request))
    return {
        "session_id": session.pk,
        "runs": [run_out(root) for root in tree.roots],
        "total_runs": tree.total,
        "truncated": tree.truncated,
        "limit": tree.limit,
    }


@sessions.get(
    "/{session_id}/pending-approvals",
    auth=READ,
    response={200: list[schemas.ApprovalOut], **READ_ERRORS},
)
def pending_approvals(request: HttpRequest, session_id: UUID) -> Any:
    session = _session(session_id)
    pending = (
        Approval.objects.open()
        .filter(session_id=session.pk)
        .select_related("tool_call", "first_approved_by", "approver", "edited_by")
        .order_by("created_at", "id")
    )
    return [approval_out(approval, viewer_roles(request)) for approval in pending]


# --- approvals ------------------------------------------------------------------------


def _decide(request: HttpRequest, approval_id: int, decision: str, digest: str, reason: str) -> Any:
    approval = Approval.objects.filter(pk=approval_id, session__deleted_at__isnull=True).first()
    if approval is None:
        raise ApiError(404, "not_found", f"No approval {approval_id}.")
    try:
        do_decide(approval.pk, request.user, decision, reason, digest=digest, producer="api")
    except ActionError as exc:
        raise _refused(exc) from exc
    approval = Approval.objects.select_related(
        "tool_call", "first_approved_by", "approver", "edited_by"
    ).get(pk=approval_id)
    return approval_out(approval)


@approvals.get("/{approval_id}", auth=READ, response={200: schemas.ApprovalOut, **READ_ERRORS})
def get_approval(request: HttpRequest, approval_id: int) -> Any:
    approval = (
        Approval.objects.filter(pk=approval_id, session__deleted_at__isnull=True)
        .select_related("tool_call", "first_approved_by", "approver", "edited_by")
        .first()
    )
    if approval is None:
        raise ApiError(404, "not_found", f"No approval {approval_id}.")
    return approval_out(approval, viewer_roles(request))


@approvals.post(
    "/{approval_id}/approve", auth=DECIDE, response={200: schemas.ApprovalOut, **WRITE_ERRORS}
)
def approve(request: HttpRequest, approval_id: int, payload: schemas.DecisionIn) -> Any:
    """First (or only) approval step. R2 (and R3 under the two-person rule) then needs
    /confirm; R3 needs a reason. `digest` must be the one the approval was shown with."""
    return _decide(request, approval_id, APPROVE, payload.digest, payload.reason)


@approvals.post(
    "/{approval_id}/confirm", auth=DECIDE, response={200: schemas.ApprovalOut, **WRITE_ERRORS}
)
def confirm(request: HttpRequest, approval_id: int, payload: schemas.DecisionIn) -> Any:
    """Second step of a two-step approval: confirm the exact action."""
    return _decide(request, approval_id, CONFIRM, payload.digest, payload.reason)


@approvals.post(
    "/{approval_id}/reject", auth=DECIDE, response={200: schemas.ApprovalOut, **WRITE_ERRORS}
)
def reject(request: HttpRequest, approval_id: int, payload: schemas.RejectIn) -> Any:
    return _decide(request, approval_id, REJECT, payload.digest, payload.reason)


api.add_router("", early_history_router)
api.add_router("/diagnosis-sessions", sessions)
api.add_router("/approvals", approvals)
api.add_router("", history_router)
api.add_router("", tools_router)
api.add_router("", skills_router)
for pack in installed_packs():
    if pack.api_router is not None:
        api.add_router("", pack.api_router())


def not_found(request: HttpRequest, unknown: str = "") -> HttpResponse:
    """Unknown paths under /api/v1/ answer with a problem too, not the HTML 404 page."""
    return problem_response(request, 404, "not_found", "No such API endpoint.")


__all__ = ["ErrorOut", "api", "not_found"]
