"""`/api/v1/skills/upload`, `/skills` and `/skills/{id}/versions` (seed 003 §4.1.4):
uploaded skills with their versions, admin only (a skill is code AERO runs). An upload is
checked whole before anything is kept (tools.skills): a refused zip is a 422 naming why."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from ninja import Field, File, Form, Query, Schema, Status
from ninja.files import UploadedFile

from aero.roles import MANAGE_TOOLS
from api import idempotency, pagination
from api.auth import TokenAuth
from api.errors import READ_ERRORS, WRITE_ERRORS, ApiError
from api.strict import StrictRouter
from tools.models import Skill, SkillVersion
from tools.skills import MAX_ZIP_BYTES, SkillRejected, save_upload

ADMIN = TokenAuth(MANAGE_TOOLS, "manage skills")
router = StrictRouter(tags=["skills"])
LIST_MAX = 100


class SkillVersionOut(Schema):
    id: int
    version: str
    description: str
    entry: str
    risk_class: str
    applies_to: list[str] = Field(..., description="The problem types it is called on.")
    arguments_schema: dict[str, Any]
    result_schema: dict[str, Any]
    files: list[str]
    sha256: str = Field(..., description="Of the uploaded zip.")
    size: int
    active: bool
    uploaded_by: str | None
    uploaded_at: datetime


class SkillOut(Schema):
    id: int
    name: str
    description: str
    risk_class: str = Field(..., description="R0 (runs as evidence) to R3; the active version's.")
    tool: str = Field(..., description="Its name as an evidence tool (skill:NAME).")
    active_version: str | None
    versions: int


class SkillPage(Schema):
    skills: list[SkillOut]
    next_cursor: str | None


class SkillVersionPage(Schema):
    versions: list[SkillVersionOut]


class SkillUploaded(Schema):
    skill: SkillOut
    version: SkillVersionOut


def skill_out(skill: Skill, versions: int) -> dict[str, Any]:
    return {
        "id": skill.pk,
        "name": skill.name,
        "description": skill.description,
        "risk_class": skill.risk_class,
        "tool": f"skill:{skill.name}",
        "active_version": skill.active_version.version if skill.active_version else None,
        "versions": versions,
    }


def version_out(version: SkillVersion, active_id: int | None) -> dict[str, Any]:
    return {
        "id": version.pk,
        "version": version.version,
        "description": version.description,
        "entry": version.entry,
        "risk_class": version.risk_class,
        "applies_to": list(version.applies_to),
        "arguments_schema": version.arguments_schema,
        "result_schema": version.result_schema,
        "files": [f.path for f in version.files.all()],
        "sha256": version.sha256,
        "size": version.size,
        "active": version.pk == active_id,
        "uploaded_by": version.uploaded_by.get_username() if version.uploaded_by else None,
        "uploaded_at": version.uploaded_at,
    }


@router.post(
    "/skills/upload",
    auth=ADMIN,
    response={201: SkillUploaded, **WRITE_ERRORS},
    summary="Upload a skill (a zip with skill.yaml)",
)
def upload_skill(
    request: HttpRequest,
    response: HttpResponse,
    file: File[UploadedFile],
    activate: Form[bool] = False,
    idempotency_key: str | None = idempotency.key_header(
        "Retry safely: the same key and zip answer the first upload again (24 h)."
    ),
) -> Any:
    """`file`: a zip with `skill.yaml` at its top (name, version, description, arguments
    and result as JSON Schemas, entry, risk R0..R3, applies_to) and the files it names.
    Kept as a new version of its skill; the first version is active, a later one when
    `activate`. A refused zip is a 422 whose code says why (too_large, zip_bomb,
    unsafe_path, not_a_zip, no_manifest, bad_manifest, missing_entry, bad_schema,
    duplicate_version, risk_lowered); nothing of it is kept. Audited."""
    if file.size is not None and file.size > MAX_ZIP_BYTES:
        raise ApiError(422, "too_large", f"The zip is over {MAX_ZIP_BYTES // 1024} KB.")
    data = file.read(MAX_ZIP_BYTES + 1)
    sent = {"sha256": hashlib.sha256(data).hexdigest(), "activate": activate}

    def create() -> tuple[int, dict[str, Any]]:
        try:
            version = save_upload(data, request.user, activate=activate)
        except SkillRejected as exc:
            raise ApiError(422, exc.code, exc.message) from exc
        skill = Skill.objects.select_related("active_version").get(pk=version.skill_id)
        body = SkillUploaded(
            skill=SkillOut(**skill_out(skill, skill.versions.count())),
            version=SkillVersionOut(**version_out(version, skill.active_version_id)),
        )
        return 201, body.model_dump(mode="json")

    status, body = idempotency.answer_once(request, response, idempotency_key, sent, create)
    return Status(status, body)


@router.get("/skills", auth=ADMIN, response={200: SkillPage, **READ_ERRORS})
def list_skills(
    request: HttpRequest,
    limit: int = Query(50, ge=1, le=LIST_MAX),
    cursor: str = pagination.cursor_query(),
) -> Any:
    """The uploaded skills by name: risk class, active version, how many versions."""
    skills = (
        Skill.objects.select_related("active_version")
        .annotate(kept=Count("versions"))
        .order_by("name")
    )
    if cursor:
        after = pagination.decode("skills", cursor).get("name")
        if not isinstance(after, str):
            raise ApiError(404, "invalid_cursor", "No such page: start again.")
        skills = skills.filter(name__gt=after)
    page = list(skills[: limit + 1])
    shown = page[:limit]
    return {
        "skills": [skill_out(s, int(getattr(s, "kept", 0))) for s in shown],
        "next_cursor": (
            pagination.encode("skills", {"name": shown[-1].name}) if len(page) > limit else None
        ),
    }


@router.get(
    "/skills/{skill_id}/versions", auth=ADMIN, response={200: SkillVersionPage, **READ_ERRORS}
)
def list_skill_versions(request: HttpRequest, skill_id: int) -> Any:
    """A skill's versions, newest first, with their manifests' schemas and files, the
    active one marked."""
    skill = Skill.objects.filter(pk=skill_id).first()
    if skill is None:
        raise ApiError(404, "not_found", f"No skill {skill_id}.")
    versions = (
        skill.versions.select_related("uploaded_by")
        .prefetch_related("files")
        .order_by("-uploaded_at", "-id")
    )
    return {"versions": [version_out(v, skill.active_version_id) for v in versions]}
