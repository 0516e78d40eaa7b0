"""Uploaded skills: a zip holding `skill.yaml` (the manifest) and the files it names,
checked before anything is kept. A zip that is too large, compresses suspiciously well,
holds a path leaving its folder or a link, lacks its manifest or entry, declares a schema
that is not JSON Schema, repeats a version or lowers the skill's risk class is refused
with a named reason (`SkillRejected`), and nothing of it is saved."""

from __future__ import annotations

import hashlib
import io
import stat
import zipfile
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import yaml
from django.db import transaction
from django.db.models import F
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from aero.models import audit
from tools.models import RISK_CLASSES, Skill, SkillFile, SkillVersion

MANIFEST = "skill.yaml"
# A skill is a script and a few data files: these bound what an upload may hold.
MAX_ZIP_BYTES = 1024 * 1024
MAX_TOTAL_BYTES = 8 * 1024 * 1024
MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_FILES = 200
# A file inflating more than this many times its stored size is taken for a zip bomb.
MAX_RATIO = 100

Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
Version = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")]


class SkillRejected(ValueError):
    """Why an upload was refused: `code` for programs, the message for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Limits(BaseModel):
    """What one run may use; a manifest may lower the defaults, never raise them past
    the caps."""

    model_config = ConfigDict(extra="forbid")
    timeout_seconds: float = Field(default=20.0, gt=0, le=120)
    memory_mb: int = Field(default=256, ge=32, le=2048)
    cpu_seconds: int = Field(default=10, ge=1, le=120)
    output_bytes: int = Field(default=256 * 1024, ge=1024, le=4 * 1024 * 1024)


class Manifest(BaseModel):
    """`skill.yaml`."""

    model_config = ConfigDict(extra="forbid")
    name: Slug
    version: Version
    description: Annotated[str, StringConstraints(max_length=500)] = ""
    arguments: dict[str, Any] = Field(description="JSON Schema of the arguments (an object)")
    result: dict[str, Any] = Field(description="JSON Schema of the result (an object)")
    entry: Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"\.py$")]
    risk: Literal["R0", "R1", "R2", "R3"] = "R0"
    # The diagnosis problem types it applies to: the investigation calls it on those.
    applies_to: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=50
    )
    limits: Limits = Field(default_factory=lambda: Limits())


@dataclass(frozen=True)
class Checked:
    """An upload that passed every check, not saved yet."""

    manifest: Manifest
    files: dict[str, bytes]
    sha256: str
    size: int


def _safe_path(name: str) -> str:
    """A member's path inside the skill's folder, or SkillRejected."""
    if "\\" in name or "\x00" in name:
        raise SkillRejected("unsafe_path", f"{name!r}: a path with a backslash or NUL")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise SkillRejected("unsafe_path", f"{name!r}: an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SkillRejected("unsafe_path", f"{name!r}: a path leaving the skill's folder")
    return "/".join(parts)


def _read_members(data: bytes) -> dict[str, bytes]:
    if len(data) > MAX_ZIP_BYTES:
        raise SkillRejected("too_large", f"the zip is over {MAX_ZIP_BYTES // 1024} KB")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as exc:
        raise SkillRejected("not_a_zip", f"not a zip file: {exc}") from None
    if len(members) > MAX_FILES:
        raise SkillRejected("too_large", f"more than {MAX_FILES} files")
    declared = 0
    for info in members:
        path = _safe_path(info.filename)
        if stat.S_ISLNK(info.external_attr >> 16):
            raise SkillRejected("unsafe_path", f"{path}: a symbolic link")
        declared += info.file_size
        if info.file_size > MAX_FILE_BYTES or declared > MAX_TOTAL_BYTES:
            raise SkillRejected(
                "too_large", f"{path}: more than {MAX_TOTAL_BYTES // (1024 * 1024)} MB unpacked"
            )
        if info.file_size > 1024 * 64 and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise SkillRejected(
                "zip_bomb", f"{path}: inflates {info.file_size // max(info.compress_size, 1)}x"
            )
    files: dict[str, bytes] = {}
    for info in members:
        if info.is_dir():
            continue
        path = _safe_path(info.filename)
        try:
            with archive.open(info) as member:
                # read no more than declared (+1): a header that lies is caught here
                content = member.read(info.file_size + 1)
        except (zipfile.BadZipFile, OSError, RuntimeError, EOFError) as exc:
            raise SkillRejected("not_a_zip", f"{path}: unreadable ({exc})") from None
        if len(content) != info.file_size:
            raise SkillRejected("zip_bomb", f"{path}: its size is not the one declared")
        if path in files:
            raise SkillRejected("unsafe_path", f"{path}: twice in the zip")
        files[path] = content
    return files


def _schema(manifest: Manifest, field: str) -> None:
    schema = getattr(manifest, field)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise SkillRejected("bad_schema", f"{field}: not a JSON Schema: {exc.message}") from None
    if schema.get("type") != "object":
        raise SkillRejected("bad_schema", f"{field}: the schema of an object (type: object)")


def check_upload(data: bytes) -> Checked:
    """Every check of an upload, before anything is kept."""
    files = _read_members(data)
    if MANIFEST not in files:
        raise SkillRejected("no_manifest", f"the zip has no {MANIFEST} at its top")
    try:
        loaded = yaml.safe_load(files[MANIFEST].decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SkillRejected("bad_manifest", f"{MANIFEST} is not YAML: {exc}") from None
    try:
        manifest = Manifest.model_validate(loaded)
    except ValidationError as exc:
        faults = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}" for e in exc.errors()
        )
        raise SkillRejected("bad_manifest", f"{MANIFEST}: {faults}") from None
    entry = _safe_path(manifest.entry)
    if entry not in files:
        raise SkillRejected("missing_entry", f"the entry {entry} is not in the zip")
    manifest = manifest.model_copy(update={"entry": entry})
    _schema(manifest, "arguments")
    _schema(manifest, "result")
    return Checked(manifest, files, hashlib.sha256(data).hexdigest(), len(data))


@transaction.atomic
def save_upload(data: bytes, actor: Any, *, activate: bool = False) -> SkillVersion:
    """Check and keep an upload as a new version of its skill (the skill made on its
    first): the first version is active, a later one when `activate`. Audited."""
    checked = check_upload(data)
    manifest = checked.manifest
    skill, created = Skill.objects.select_for_update().get_or_create(
        name=manifest.name, defaults={"description": manifest.description}
    )
    if skill.versions.filter(version=manifest.version).exists():
        raise SkillRejected(
            "duplicate_version", f"{manifest.name} already has a version {manifest.version}"
        )
    if not created and RISK_CLASSES.index(manifest.risk) < RISK_CLASSES.index(skill.risk_class):
        raise SkillRejected(
            "risk_lowered",
            f"risk {manifest.risk} is below {skill.name}'s {skill.risk_class}: "
            "a version may keep or raise its skill's risk class, never lower it",
        )
    version = SkillVersion.objects.create(
        skill=skill,
        version=manifest.version,
        description=manifest.description,
        manifest=manifest.model_dump(mode="json"),
        arguments_schema=manifest.arguments,
        result_schema=manifest.result,
        entry=manifest.entry,
        risk_class=manifest.risk,
        applies_to=list(manifest.applies_to),
        sha256=checked.sha256,
        size=checked.size,
        uploaded_by=actor if getattr(actor, "is_authenticated", False) else None,
    )
    SkillFile.objects.bulk_create(
        SkillFile(
            version=version,
            path=path,
            size=len(content),
            sha256=hashlib.sha256(content).hexdigest(),
            content=content,
        )
        for path, content in sorted(checked.files.items())
    )
    audit(
        "skill.uploaded",
        obj=skill,
        actor=actor,
        detail={
            "version": version.version,
            "sha256": version.sha256,
            "risk": version.risk_class,
            "entry": version.entry,
            "files": sorted(checked.files),
        },
    )
    if created or activate:
        activate_version(version, actor)
    return version


def activate_version(version: SkillVersion, actor: Any) -> None:
    """Make `version` the one that runs (its risk class becomes the skill's). Audited."""
    skill = Skill.objects.select_for_update().get(pk=version.skill_id)
    if skill.active_version_id == version.pk:
        return
    before = skill.active_version.version if skill.active_version else None
    skill.active_version = version
    skill.risk_class = version.risk_class
    skill.description = version.description or skill.description
    skill.save(update_fields=["active_version", "risk_class", "description", "updated_at"])
    audit(
        "skill.activated",
        obj=skill,
        actor=actor,
        detail={"version": version.version, "before": before, "risk": version.risk_class},
    )


def active_skills(problem_type: str = "") -> list[SkillVersion]:
    """The active versions of the skills, those applying to `problem_type` when given."""
    versions = SkillVersion.objects.select_related("skill").filter(skill__active_version=F("pk"))
    found = list(versions.order_by("skill__name"))
    if problem_type:
        found = [v for v in found if problem_type in v.applies_to]
    return found
