"""The multipart half of `POST /api/v1/diagnosis-sessions`: a session opened from an
evidence file (an IT diagnosis's incident bundle) by the installed pack that reads them
(aero.packs). The form's fields are checked by a pydantic model as strictly as the JSON
body (an unknown or repeated field is refused), the file is streamed to a scratch folder
and hashed for the Idempotency-Key's fingerprint; a bad bundle creates nothing."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import pydantic
from django.conf import settings
from django.http import HttpRequest
from django.http.multipartparser import MultiPartParserError
from ninja.errors import ValidationError
from pydantic import AwareDatetime, Field, model_validator

from aero.packs import UnknownDomain, file_pack
from api.errors import ApiError
from api.idempotency import request_hash, run_once
from api.schemas import NO_NUL, StrictIn
from diagnosis.actions import ActionError

FILE = "bundle"


class BundleSessionIn(StrictIn):
    """The form's fields beside the `bundle` file."""

    title: str = Field("", max_length=200, pattern=NO_NUL)
    description: str = Field(
        "",
        max_length=4000,
        pattern=NO_NUL,
        description="What the reporter sees (empty: the bundle's own).",
    )
    problem_type: str = Field(
        "",
        max_length=64,
        pattern=r"^[a-z0-9_]*$",
        description="One of the scenario's problem types; empty: classified from the evidence.",
    )
    preferred_mode: Literal["", "react", "plan_execute", "hierarchical"] = Field(
        "", description="react, plan_execute or hierarchical; empty: the default."
    )
    sources: Literal["bundle", "system"] = Field(
        "bundle",
        description="Where the evidence comes from: the bundle's files, or the sources an "
        "admin attached to the system (its metrics source and its code's git server; logs "
        "stay the bundle's).",
    )
    metrics_source: str = Field(
        "",
        max_length=60,
        pattern=r"^[-a-zA-Z0-9_]*$",
        description="A configured metrics source (Prometheus) by name; empty: the bundle's "
        "metrics.csv (or the system's, with sources=system). Not with sources=system.",
    )
    since: AwareDatetime | None = Field(
        None, description="Without a bundle: where the incident's window starts."
    )
    until: AwareDatetime | None = Field(
        None, description="Without a bundle: where it ends (empty: now)."
    )

    @model_validator(mode="after")
    def _window(self) -> BundleSessionIn:
        if self.since and self.until and self.since >= self.until:
            raise ValueError("since must be before until")
        return self

    def options(self) -> dict[str, Any]:
        """The pack's start options: the window as ISO text, left out when not given."""
        chosen = self.model_dump(exclude={"since", "until"})
        for name in ("since", "until"):
            value: datetime | None = getattr(self, name)
            if value is not None:
                chosen[name] = value.isoformat()
        return chosen


def form_schema() -> dict[str, Any]:
    """The multipart body in the OpenAPI document: the file and the fields' own schema."""
    schema = BundleSessionIn.model_json_schema()
    bundle = {
        "type": "string",
        "format": "binary",
        "description": "The incident bundle: a .zip or .tar.gz of a bundle folder, at most "
        f"{settings.AERO_BUNDLE_MAX_UPLOAD} bytes. Left out only with sources=system (a "
        "description then says what happened, since/until the window).",
    }
    return {
        "title": "BundleSessionIn",
        "type": "object",
        "properties": {FILE: bundle, **schema["properties"]},
        "additionalProperties": False,
    }


def _invalid(where: str, name: str, msg: str) -> ValidationError:
    # ninja's own shape (its handler words the problem): form fields under "form", the
    # file under "file", as its Form and File parameters report them
    return ValidationError([{"loc": (where, name), "msg": msg}])


def read_form(request: HttpRequest) -> tuple[BundleSessionIn, Any]:
    """The checked fields and the uploaded file (None: a session on the system's sources
    without a bundle), or a 400/422 problem."""
    try:
        fields, files = request.POST, request.FILES
    except MultiPartParserError as exc:
        raise ApiError(400, "bad_request", f"The multipart body cannot be read: {exc}") from exc
    for name in sorted(files):
        if name != FILE:
            raise _invalid("file", name, "Extra inputs are not permitted")
        if len(files.getlist(name)) > 1:
            raise _invalid("file", name, "Send one bundle")
    for name in sorted(fields):
        if len(fields.getlist(name)) > 1:
            raise _invalid("form", name, "Sent more than once")
    try:
        checked = BundleSessionIn.model_validate(fields.dict())
    except pydantic.ValidationError as exc:
        raise ValidationError(
            [{"loc": ("form", *e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        ) from exc
    bundle = files.get(FILE)
    if bundle is None and checked.sources != "system":
        raise _invalid("file", FILE, "Field required")
    if bundle is not None and (checked.since or checked.until):
        raise _invalid("form", "since", "The window is the bundle's: since/until go without one")
    return checked, bundle


def create_from_bundle(
    request: HttpRequest, idempotency_key: str | None
) -> tuple[int, dict[str, Any], bool]:
    """(status, body, replayed) of a multipart create. A bad bundle is a 422 naming its
    file, line and field; nothing is created."""
    form, bundle = read_form(request)
    if (
        bundle is not None
        and bundle.size is not None
        and bundle.size > settings.AERO_BUNDLE_MAX_UPLOAD
    ):
        raise ApiError(
            422, "bundle_too_large", f"The bundle is over {settings.AERO_BUNDLE_MAX_UPLOAD} bytes."
        )
    try:
        pack = file_pack()
    except UnknownDomain as exc:
        raise ApiError(404, "not_found", str(exc)) from exc
    start = pack.start_from_file
    assert start is not None
    scratch = Path(tempfile.mkdtemp(prefix="aero-api-bundle-"))
    try:
        source: Path | None = None
        digest = hashlib.sha256()
        if bundle is not None:
            source = scratch / "bundle"
            with source.open("wb") as out:
                for chunk in bundle.chunks():
                    digest.update(chunk)
                    out.write(chunk)
        options = form.options()
        sent = {"bundle_sha256": digest.hexdigest() if source else None, **options}

        def create() -> tuple[int, dict[str, Any]]:
            try:
                session = start(request.user, source, {"producer": "api", **options})
            except ActionError as exc:
                raise ApiError(422, "invalid_bundle", str(exc)) from exc
            return 201, {"session_id": str(session.pk), "status": session.status}

        return run_once(
            request.user, idempotency_key, request_hash("POST", request.path, sent), create
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
