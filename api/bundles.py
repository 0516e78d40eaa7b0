"""`POST /api/v1/diagnosis-sessions/bundle`: a session opened from an evidence file (an
IT diagnosis's incident bundle), by the installed pack that reads them (aero.packs);
multipart, with Idempotency-Key like every create."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from ninja import File, Form, Status
from ninja.files import UploadedFile

from aero.packs import UnknownDomain, file_pack
from api import idempotency, schemas
from api.auth import RUN
from api.errors import WRITE_ERRORS, ApiError
from api.idempotency import REPLAYED, request_hash, run_once
from api.strict import StrictRouter
from diagnosis.actions import ActionError

router = StrictRouter(tags=["sessions"])


@router.post(
    "",
    auth=RUN,
    response={201: schemas.SessionCreated, **WRITE_ERRORS},
    summary="Open an IT diagnosis session from an incident bundle",
)
def create_from_bundle(
    request: HttpRequest,
    response: HttpResponse,
    bundle: UploadedFile = File(  # noqa: B008 - ninja's parameter declaration
        ..., description="The incident bundle: a .zip or .tar.gz of a bundle folder."
    ),
    description: str = Form(
        "", max_length=4000, description="What the reporter sees (empty: the bundle's own)."
    ),
    title: str = Form("", max_length=200),
    problem_type: str = Form(
        "",
        max_length=64,
        pattern=r"^[a-z0-9_]*$",
        description="One of the scenario's problem types; empty: classified from the evidence.",
    ),
    preferred_mode: str = Form(
        "",
        pattern=r"^(|react|plan_execute|hierarchical)$",
        description="react, plan_execute or hierarchical; empty: the default.",
    ),
    idempotency_key: str | None = idempotency.key_header(),
) -> Any:
    """A bad bundle is a 422 naming its file, line and field; nothing is created."""
    if bundle.size is not None and bundle.size > settings.AERO_BUNDLE_MAX_UPLOAD:
        raise ApiError(
            422, "bundle_too_large", f"The bundle is over {settings.AERO_BUNDLE_MAX_UPLOAD} bytes."
        )
    try:
        pack = file_pack()
    except UnknownDomain as exc:
        raise ApiError(404, "not_found", str(exc)) from exc
    assert pack.start_from_file is not None
    scratch = Path(tempfile.mkdtemp(prefix="aero-api-bundle-"))
    try:
        source = scratch / "bundle"
        digest = hashlib.sha256()
        with source.open("wb") as out:
            for chunk in bundle.chunks():
                digest.update(chunk)
                out.write(chunk)
        sent = {
            "bundle_sha256": digest.hexdigest(),
            "description": description,
            "title": title,
            "problem_type": problem_type,
            "preferred_mode": preferred_mode,
        }

        def create() -> tuple[int, dict[str, Any]]:
            assert pack.start_from_file is not None
            try:
                session = pack.start_from_file(
                    request.user,
                    source,
                    {
                        "producer": "api",
                        "description": description,
                        "title": title,
                        "problem_type": problem_type,
                        "preferred_mode": preferred_mode,
                    },
                )
            except ActionError as exc:
                raise ApiError(422, "invalid_bundle", str(exc)) from exc
            return 201, {"session_id": str(session.pk), "status": session.status}

        status, body, replayed = run_once(
            request.user, idempotency_key, request_hash("POST", request.path, sent), create
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if replayed:
        request.idempotent_replay = True  # type: ignore[attr-defined]
        response[REPLAYED] = "true"
    if status == 201:
        response["Location"] = reverse("api:get_session", kwargs={"session_id": body["session_id"]})
    return Status(status, body)
