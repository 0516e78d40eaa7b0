"""`/api/v1/knowledge-items`: the knowledge base for machines (seed 003), and
`/api/v1/diagnosis-sessions/{id}/bundle`, the stored incident bundle as a zip. Read by every
role that may view sessions; written by operators and admins, as the session page's
"save to the knowledge base" is, with the audit entry the admin's add writes. The core's
API mounts this router (DomainPack.api_router) and lends it its tokens, problems,
Idempotency-Key and paging."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import Field, Path, Query, Schema, Status
from pydantic import ConfigDict, StringConstraints, model_validator

from aero.roles import VIEW_SESSIONS
from api import idempotency, pagination
from api.auth import RUN, TokenAuth
from api.errors import READ_ERRORS, WRITE_ERRORS, ApiError
from api.presenters import viewer_roles
from api.schemas import NO_NUL, StrictIn
from api.strict import StrictRouter
from diagnosis.actions import ActionError
from diagnosis.models import Session
from packs.diagnosis.knowledge import CANDIDATES, do_create_knowledge, search
from packs.diagnosis.models import KnowledgeItem
from packs.diagnosis.storage import bundle_response, may_download_bundle

READ = TokenAuth(VIEW_SESSIONS, "view sessions")
router = StrictRouter(tags=["knowledge"])
KEY = r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,39}$"
SERVICE = r"^[-a-zA-Z0-9_.]+$"
LIST_MAX = 100

Title = Annotated[str, StringConstraints(strip_whitespace=True, max_length=200, pattern=NO_NUL)]
Body = Annotated[str, StringConstraints(strip_whitespace=True, max_length=8000, pattern=NO_NUL)]
Service = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64, pattern=SERVICE)
]
Tag = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=40, pattern=NO_NUL)
]


class KnowledgeItemIn(StrictIn):
    # The schema says what the validator below checks: a title in one language.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [name], "properties": {name: {"pattern": r"\S"}}}
                for name in ("title_zh", "title_en")
            ]
        }
    )

    key: str = Field(
        "",
        pattern=r"^$|" + KEY,
        description="The id people cite, e.g. KB-101; empty: one is made (K-<8 hex>).",
    )
    title_zh: Title = ""
    title_en: Title = ""
    problem_type: str = Field("", max_length=40, pattern=r"^[a-z0-9_]*$", examples=["error_spike"])
    hypothesis: str = Field(
        "",
        max_length=40,
        pattern=r"^[a-z0-9_]*$",
        description="The root-cause kind, e.g. bad_deploy.",
    )
    services: list[Service] = Field(default_factory=list, max_length=20)
    tags: list[Tag] = Field(default_factory=list, max_length=20)
    symptoms_zh: Body = ""
    symptoms_en: Body = ""
    root_cause_zh: Body = ""
    root_cause_en: Body = ""
    fix_zh: Body = ""
    fix_en: Body = ""

    @model_validator(mode="after")
    def has_a_title(self) -> KnowledgeItemIn:
        if not (self.title_zh or self.title_en):
            raise ValueError("title_zh or title_en: an item needs a title in one language")
        return self


class KnowledgeItemOut(Schema):
    id: str = Field(..., description="The id people cite (a similar case's id).")
    title_zh: str
    title_en: str
    problem_type: str
    hypothesis: str
    services: list[str]
    tags: list[str]
    symptoms_zh: str
    symptoms_en: str
    root_cause_zh: str
    root_cause_en: str
    fix_zh: str
    fix_en: str
    source: str = Field(..., description="shipped, admin, session or api.")
    session_id: UUID | None = Field(..., description="The session it was saved from.")
    created_by: str | None
    created_at: datetime
    updated_at: datetime
    score: float | None = Field(
        None, description="With q: how well it matches (0..1), as similar cases are scored."
    )


class KnowledgePage(Schema):
    items: list[KnowledgeItemOut]
    next_cursor: str | None


def item_out(item: KnowledgeItem, score: float | None = None) -> dict[str, Any]:
    return {
        "id": item.key,
        **{
            name: getattr(item, name)
            for name in (
                "title_zh",
                "title_en",
                "problem_type",
                "hypothesis",
                "services",
                "tags",
                "symptoms_zh",
                "symptoms_en",
                "root_cause_zh",
                "root_cause_en",
                "fix_zh",
                "fix_en",
                "source",
                "session_id",
                "created_at",
                "updated_at",
            )
        },
        "created_by": item.created_by.get_username() if item.created_by else None,
        "score": score,
    }


@router.post(
    "/knowledge-items",
    auth=RUN,
    response={201: KnowledgeItemOut, **WRITE_ERRORS},
    summary="Add a knowledge item",
)
def create_knowledge_item(
    request: HttpRequest,
    response: HttpResponse,
    payload: KnowledgeItemIn,
    idempotency_key: str | None = idempotency.key_header(),
) -> Any:
    """A past incident written by a person (operators and admins), searched like every
    item when a diagnosis concludes. A key already taken is a 409 `key_taken`."""
    sent = payload.model_dump()

    def create() -> tuple[int, dict[str, Any]]:
        try:
            item = do_create_knowledge(request.user, dict(sent))
        except ActionError as exc:
            raise ApiError(409, "key_taken", str(exc)) from exc
        # as JSON (dates as text): the body is stored for a retry's replay
        return 201, KnowledgeItemOut(**item_out(item)).model_dump(mode="json")

    status, body = idempotency.answer_once(request, response, idempotency_key, sent, create)
    response["Location"] = reverse("api:get_knowledge_item", kwargs={"item_id": body["id"]})
    return Status(status, body)


def _filtered(problem_type: str, service: str) -> QuerySet[KnowledgeItem]:
    items = KnowledgeItem.objects.select_related("created_by")
    if problem_type:
        items = items.filter(problem_type=problem_type)
    if service:
        items = items.filter(services__contains=[service])
    return items


@router.get("/knowledge-items", auth=READ, response={200: KnowledgePage, **READ_ERRORS})
def list_knowledge_items(
    request: HttpRequest,
    q: str = Query(
        "",
        max_length=200,
        pattern=NO_NUL,
        description="Free text, searched as similar cases are (best first, with a score).",
    ),
    problem_type: str = Query("", max_length=40, pattern=r"^[a-z0-9_]*$"),
    service: str = Query("", max_length=64, pattern=r"^[-a-zA-Z0-9_.]*$"),
    limit: int = Query(50, ge=1, le=LIST_MAX),
    cursor: str = pagination.cursor_query(),
) -> Any:
    """Knowledge items by id; with `q`, the best matches first (at most fifty, as the
    similar-case search scores its candidates)."""
    items = _filtered(problem_type, service)
    if q.strip():
        return _searched(q, items, limit, cursor)
    if cursor:
        after = pagination.decode("knowledge", cursor).get("key")
        if not isinstance(after, str):
            raise ApiError(404, "invalid_cursor", "No such page: start again.")
        items = items.filter(key__gt=after)
    page = list(items.order_by("key")[: limit + 1])
    shown = page[:limit]
    return {
        "items": [item_out(item) for item in shown],
        "next_cursor": (
            pagination.encode("knowledge", {"key": shown[-1].key}) if len(page) > limit else None
        ),
    }


def _searched(q: str, items: QuerySet[KnowledgeItem], limit: int, cursor: str) -> dict[str, Any]:
    """The search's matches among `items`, paged by a keyset on (score, id): the order the
    search ranks them in."""
    allowed = set(items.values_list("pk", flat=True))
    matches = [m for m in search(q, limit=CANDIDATES) if m.item.pk in allowed]
    if cursor:
        after = pagination.decode(f"knowledge:{q}", cursor)
        score, key = after.get("score"), after.get("key")
        if not isinstance(score, (int, float)) or not isinstance(key, str):
            raise ApiError(404, "invalid_cursor", "No such page: start again.")
        matches = [m for m in matches if (-m.score, m.item.key) > (-score, key)]
    shown = matches[:limit]
    # created_by for the page only (the search loads the items without it)
    people = {
        item.pk: item
        for item in KnowledgeItem.objects.select_related("created_by").filter(
            pk__in=[m.item.pk for m in shown]
        )
    }
    return {
        "items": [item_out(people[m.item.pk], m.score) for m in shown],
        "next_cursor": (
            pagination.encode(
                f"knowledge:{q}", {"score": shown[-1].score, "key": shown[-1].item.key}
            )
            if len(matches) > limit
            else None
        ),
    }


@router.get(
    "/knowledge-items/{item_id}",
    auth=READ,
    response={200: KnowledgeItemOut, **READ_ERRORS},
)
def get_knowledge_item(
    request: HttpRequest,
    item_id: str = Path(..., max_length=40, pattern=KEY, description="The item's id, e.g. KB-003."),
) -> Any:
    item = KnowledgeItem.objects.select_related("created_by").filter(key=item_id).first()
    if item is None:
        raise ApiError(404, "not_found", f"No knowledge item {item_id}.")
    return item_out(item)


ZIP = {"application/zip": {"schema": {"type": "string", "format": "binary"}}}


@router.get(
    "/diagnosis-sessions/{session_id}/bundle",
    auth=READ,
    response=READ_ERRORS,
    tags=["sessions"],
    openapi_extra={
        "responses": {"200": {"description": "The stored bundle as a zip", "content": ZIP}}
    },
)
def get_session_bundle(request: HttpRequest, session_id: UUID) -> Any:
    """The incident bundle the session was started from, as a zip streamed as it is read
    (files under `bundle-{id}/`), audited as `session.bundle_downloaded`. It is raw
    (unmasked): viewers who read sessions masked (auditors) get 403. A deleted session's
    bundle is gone with it (404), as is any session not started from a bundle."""
    # the role first, as every operation checks it: a refused viewer learns nothing more
    if not may_download_bundle(viewer_roles(request)):
        raise ApiError(
            403, "forbidden", "The bundle is raw data (unmasked): this token reads it masked."
        )
    session = Session.objects.visible().filter(pk=session_id).first()
    if session is None:
        raise ApiError(404, "not_found", f"No session {session_id}.")
    response = bundle_response(session, request.user, via="api")
    if response is None:
        raise ApiError(404, "no_bundle", f"Session {session_id} has no stored bundle.")
    return response


__all__ = ["router"]
