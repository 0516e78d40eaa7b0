"""History search and Markdown export over the API: replay's own search and export code,
with the pages' access rules (any role that may view sessions; read-only viewers get the
masked export) and the pages' audit entry for every export that leaves the system."""

from __future__ import annotations

from dataclasses import asdict
from datetime import date, datetime
from typing import Any, Literal
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Schema, Status
from pydantic import create_model

from aero.roles import ADMIN, VIEW_SESSIONS
from api import pagination
from api.auth import TokenAuth
from api.errors import READ_ERRORS, ApiError
from api.presenters import envelope, masks, viewer_mask, viewer_roles
from api.strict import StrictRouter
from diagnosis.models import Event, Session, SessionStatus
from replay import history, jobs, presenters
from replay.export import render_export
from replay.forms import HistoryForm
from replay.history import pack_filters, parse_cursor
from scenarios_admin.models import Scenario

READ = TokenAuth(VIEW_SESSIONS, "view sessions")
router = StrictRouter(tags=["history"])
# Mounted before the sessions' router, whose /{session_id} would read "history" as an id.
early = StrictRouter(tags=["history"])
MARKDOWN = {"text/markdown": {"schema": {"type": "string"}}}


def _fields(model: type[Schema]) -> dict[str, Any]:
    """A schema's fields as create_model takes them (their order, aliases and checks)."""
    return {name: (info.annotation, info) for name, info in model.model_fields.items()}


def _typed_filters() -> dict[str, Any]:
    """The installed packs' typed history filters as query parameters (the apron's flight
    and position), where the risk's is: each as its pack declares it."""
    return {
        name: (str, Field("", max_length=item.max_length, pattern=item.pattern or None))
        for name, item in pack_filters().items()
        if item.choices is None
    }


def _column_fields() -> dict[str, Any]:
    """The packs' columns of a history row (the apron's flight and position)."""
    return {name: (str, ...) for name, item in pack_filters().items() if item.column}


class _QueryHead(Schema):
    q: str = Field("", max_length=200, pattern=r"^[^\x00]*$", description="Free text.")
    problem_type: str = Field("", max_length=64, pattern=r"^[-a-zA-Z0-9_]*$")
    status: Literal["", *SessionStatus.values] = ""  # type: ignore[valid-type]
    risk: Literal["", "LOW", "MEDIUM", "HIGH"] = ""


class _QueryTail(Schema):
    creator: str = Field("", max_length=150, pattern=r"^[-\w.@+]*$")
    service: str = Field(
        "", max_length=64, pattern=r"^[-a-zA-Z0-9_.]*$", description="The root cause's service."
    )
    since: date | None = None
    until: date | None = None
    from_: date | None = Field(None, alias="from", description="Seed 003's name for since.")
    to: date | None = Field(None, description="Seed 003's name for until.")
    sort: Literal["-created", "created", "-updated"] = "-created"
    limit: int = Field(50, ge=1, le=100)
    cursor: str = Field(
        "",
        max_length=pagination.MAX_CURSOR,
        pattern=pagination.CURSOR_PATTERN,
        description=pagination.CURSOR_DOC,
    )


# The query in the order clients read it: the packs' typed filters after the risk.
HistoryQuery = create_model(
    "HistoryQuery",
    __base__=Schema,
    **_fields(_QueryHead),
    **_typed_filters(),
    **_fields(_QueryTail),
)


class _RowHead(Schema):
    id: UUID
    title: str
    status: str
    problem_type: str
    created_by: str
    created_at: Any
    updated_at: Any


class _RowTail(Schema):
    risk: str
    facts: dict[str, str] = Field(
        ..., description="What a pack files its sessions by, e.g. problem_type and service."
    )


HistoryRow = create_model(
    "HistoryRow", __base__=Schema, **_fields(_RowHead), **_column_fields(), **_fields(_RowTail)
)


class HistoryPage(Schema):
    sessions: list[HistoryRow]  # type: ignore[valid-type]
    next_cursor: str | None


class ExportJobOut(Schema):
    job_id: str
    session_id: UUID
    status: str
    done: int
    total: int


def _search(request: HttpRequest, filters: Any) -> dict[str, Any]:
    data = filters.model_dump()
    limit = data.pop("limit")
    empty: dict[str, Any] = {"sessions": [], "next_cursor": None}
    for seed_name, name in (("from_", "since"), ("to", "until")):
        value = data.pop(seed_name)
        if value is not None and data[name] is not None:
            other = seed_name.rstrip("_")
            raise ApiError(422, "invalid_input", f"{name} and {other} are one filter: give one.")
        data[name] = data[name] or value
    # Filters that cannot match anything find nothing (rather than being "invalid").
    if data["since"] and data["until"] and data["since"] > data["until"]:
        return empty
    if data["creator"] and not User.objects.filter(username=data["creator"]).exists():
        return empty
    # A problem type is a scenario's, or one a pack classifies its sessions by (an IT
    # diagnosis's error_spike): the pack's filter of that name says which.
    facts = pack_filters()
    problem_type = data.pop("problem_type")
    if problem_type and Scenario.objects.filter(slug=problem_type).exists():
        data["scenario"] = problem_type
    elif problem_type:
        fact = facts.get("problem_type")
        if fact is None or fact.choices is None or problem_type not in dict(fact.choices()):
            return empty
        data["problem_type"] = problem_type
    if data["service"]:
        fact = facts.get("service")
        if fact is None or fact.choices is None or data["service"] not in dict(fact.choices()):
            return empty
    if data["cursor"]:
        # the position in the replay search's own terms, for this sort order only
        inner = pagination.decode(f"history:{data['sort']}", data["cursor"]).get("at")
        try:
            parse_cursor(str(inner))
        except ValueError:
            raise ApiError(404, "invalid_cursor", "No such page: start again.") from None
        data["cursor"] = inner
    form = HistoryForm({k: ("" if v is None else str(v)) for k, v in data.items()})
    if not form.is_valid():
        field, errors = next(iter(form.errors.items()))
        raise ApiError(422, "invalid_input", f"{field}: {errors[0]}")
    page = history.search(form.cleaned_data, limit, viewer_roles(request))
    return {
        "sessions": [
            {
                "id": row["session"].pk,
                "title": row["session"].title,
                "status": row["session"].status,
                "problem_type": row["session"].scenario.slug,
                "created_by": row["session"].created_by.get_username(),
                "created_at": row["session"].created_at,
                "updated_at": row["session"].updated_at,
                **row["columns"],
                "risk": row["risk"],
                "facts": row["facts"],
            }
            for row in page.rows
        ],
        "next_cursor": (
            pagination.encode(f"history:{data['sort']}", {"at": page.next_cursor})
            if page.next_cursor
            else None
        ),
    }


@router.get("/history", auth=READ, response={200: HistoryPage, **READ_ERRORS})
def search(request: HttpRequest, filters: Query[HistoryQuery]) -> Any:  # type: ignore[valid-type]
    """Sessions by text, problem type, service, status, risk, flight, position, creator
    and dates, as on /history/ (deleted sessions excluded), `limit` a page. A problem
    type is a scenario's or an IT diagnosis's (`error_spike`); `service` is a diagnosis's
    root-cause service; `from`/`to` are seed 003's names for `since`/`until`."""
    return _search(request, filters)


@early.get("/diagnosis-sessions/history", auth=READ, response={200: HistoryPage, **READ_ERRORS})
def diagnosis_history(request: HttpRequest, filters: Query[HistoryQuery]) -> Any:  # type: ignore[valid-type]
    """The same search as /history, under the sessions' own path."""
    return _search(request, filters)


class ReplayCall(Schema):
    call_id: str
    tool_name: str
    args: Any
    risk_class: str
    status: str
    result: Any
    error: Any
    completed_at: datetime | None
    decisions: list[dict[str, Any]]
    masked: bool


class ReplayState(Schema):
    status: str
    ts: datetime | None
    snapshot: dict[str, Any]
    tool_calls: list[ReplayCall]
    report_markdown: str
    tokens_in: int
    tokens_out: int
    cost: str


class ReplayOut(Schema):
    session_id: UUID
    seq: int = Field(..., description="The step shown: the state is the log folded to here.")
    last_seq: int
    deleted: bool
    masked: bool = Field(..., description="Values the masking rule hides are masked.")
    event: dict[str, Any] | None = Field(..., description="The step's event (its envelope).")
    navigation: dict[str, int | None] = Field(
        ..., description="first, previous, next and last seq: where to step from here."
    )
    state: ReplayState


NO_FILTERS = presenters.Filters(groups=[], run_ids=None, since=None, until=None)


@router.get(
    "/diagnosis-sessions/{session_id}/replay",
    auth=READ,
    response={200: ReplayOut, **READ_ERRORS},
)
def replay_session(
    request: HttpRequest,
    session_id: UUID,
    seq: int | None = Query(
        None,
        ge=0,
        le=2**53,
        description="The step to show (default: the last); past the log's end: 404 no_such_step.",
    ),
    at: datetime | None = Query(  # noqa: B008 - ninja's parameter declaration
        None, description="Or a moment: the last step at or before it (wins over seq)."
    ),
) -> Any:
    """The session as it stood at one step of its log (the replay page's player): what
    it knew, the calls and decisions so far, the report if written, and the step's event;
    deleted sessions too (marked), masked for read-only viewers as on the replay pages."""
    session = (
        Session.objects.select_related("scenario", "scenario_version", "created_by")
        .filter(pk=session_id)
        .first()
    )
    if session is None:
        raise ApiError(404, "not_found", f"No session {session_id}.")
    if seq is not None and seq > session.last_seq:
        # a well-formed step that does not exist (yet): not found, as the schema allows
        raise ApiError(
            404, "no_such_step", f"seq {seq}: this session has {session.last_seq} events."
        )
    if at is not None:
        seq = presenters.seq_at_time(session, NO_FILTERS, at)
    shown_seq = session.last_seq if seq is None else seq
    mask = viewer_mask(session.pk, request)
    state = presenters.shown_state(presenters.state_at(session, shown_seq), mask)
    event = Event.objects.filter(session_id=session.pk, seq=shown_seq).first()
    calls = []
    for row in presenters.evidence_calls(state, mask):
        calls.append(
            {
                **{k: v for k, v in row.items() if k not in ("approval", "duration_ms")},
                "decisions": [asdict(d) for d in row["decisions"]],
            }
        )
    return {
        "session_id": session.pk,
        "seq": shown_seq,
        "last_seq": session.last_seq,
        "deleted": session.deleted_at is not None,
        "masked": mask is not None,
        "event": envelope(event, mask) if event else None,
        "navigation": presenters.navigation(session, NO_FILTERS, shown_seq),
        "state": {
            "status": state.status,
            "ts": state.ts,
            "snapshot": state.snapshot,
            "tool_calls": calls,
            "report_markdown": presenters.report_markdown(state, mask, session),
            "tokens_in": state.tokens_in,
            "tokens_out": state.tokens_out,
            "cost": str(state.cost),
        },
    }


def _markdown(session: Session, text: str) -> HttpResponse:
    response = HttpResponse(text, content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="aero-session-{session.pk}.md"'
    return response


@router.post(
    "/diagnosis-sessions/{session_id}/replay/export-md",
    auth=READ,
    response={202: ExportJobOut, **READ_ERRORS},
    openapi_extra={
        "responses": {"200": {"description": "The Markdown export", "content": MARKDOWN}}
    },
)
def export_markdown(request: HttpRequest, session_id: UUID) -> Any:
    """The session as Markdown (the replay page's export, masked for read-only viewers).
    Sessions over AERO_REPLAY_EXPORT_INLINE_EVENTS events export in the background: 202
    with a job to poll at /exports/{job_id}."""
    session = (
        Session.objects.select_related("scenario", "scenario_version", "created_by")
        .filter(pk=session_id)
        .first()
    )
    if session is None:
        raise ApiError(404, "not_found", f"No session {session_id}.")
    masked = masks(viewer_roles(request))
    if session.last_seq > settings.AERO_REPLAY_EXPORT_INLINE_EVENTS:
        job = jobs.start_export(session, request.user, masked=masked)
        return Status(202, _job_out(job))
    text = render_export(session, request.user, masked=masked)
    jobs.audit_export(session, request.user, text, masked=masked, mode="api")
    return _markdown(session, text)


@router.get(
    "/exports/{job_id}",
    auth=READ,
    response={202: ExportJobOut, **READ_ERRORS},
    openapi_extra={
        "responses": {"200": {"description": "The finished export", "content": MARKDOWN}}
    },
)
def export_job(request: HttpRequest, job_id: str) -> Any:
    """A background export: 202 with its progress until it is done, then the Markdown.
    An export is its requester's (admins may fetch any)."""
    job = jobs.get_job(job_id)
    if job is None or (job.user_id != request.user.pk and ADMIN not in viewer_roles(request)):
        raise ApiError(404, "not_found", "No such export.")
    if job.status != "done":
        return Status(202, _job_out(job))
    text = jobs.job_body(job)
    if text is None:
        raise ApiError(404, "not_found", "This export has expired.")
    session = Session.objects.get(pk=job.session_id)
    jobs.audit_export(session, request.user, text, masked=job.masked, mode="api-background")
    return _markdown(session, text)


def _job_out(job: jobs.ExportJob) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "session_id": job.session_id,
        "status": job.status,
        "done": job.done,
        "total": job.total,
    }
