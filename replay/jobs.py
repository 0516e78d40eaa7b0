"""Background exports. Replay owns no table: a job's progress and its finished Markdown
live in the "replay" cache (Redis in production, shared by web and workers; per process
in embedded mode, where the job runs in a thread of the web process).

Backends follow diagnosis.jobs: `rq` (django-rq), `embedded` (a thread), `inline` (the
caller: tests and the CLI)."""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connections, transaction
from django.utils import translation

from aero.models import audit
from aero.shared_caches import shared_cache
from diagnosis.models import Session
from replay.export import digest, render_export

logger = logging.getLogger("diagnosis.replay")
EXPORT_TTL = 24 * 3600  # a finished export can be downloaded for a day


@dataclass
class ExportJob:
    job_id: str
    session_id: str
    user_id: int
    masked: bool
    # The export speaks the language of the person who asked for it.
    language: str = settings.LANGUAGE_CODE
    status: str = "queued"  # queued, running, done, failed
    done: int = 0
    total: int = 0
    sha256: str = ""
    error: str = ""

    @property
    def percent(self) -> int:
        return (
            100 if self.status == "done" else int(100 * self.done / self.total) if self.total else 0
        )


def _key(job_id: str) -> str:
    return f"replay:export:{job_id}"


def _save(job: ExportJob) -> None:
    shared_cache("replay").set(_key(job.job_id), asdict(job), timeout=EXPORT_TTL)


def get_job(job_id: str) -> ExportJob | None:
    raw = shared_cache("replay").get(_key(job_id))
    return ExportJob(**raw) if raw else None


def job_body(job: ExportJob) -> str | None:
    body: str | None = shared_cache("replay").get(_key(job.job_id) + ":body")
    return body


def start_export(session: Session, user: Any, *, masked: bool) -> ExportJob:
    """Queue an export of the session for the user; it runs after the current transaction
    commits."""
    job = ExportJob(
        job_id=uuid.uuid4().hex,
        session_id=str(session.pk),
        user_id=user.pk,
        masked=masked,
        language=translation.get_language() or settings.LANGUAGE_CODE,
        total=session.last_seq,
    )
    _save(job)
    transaction.on_commit(lambda: _dispatch(job.job_id))
    return job


_pool: ThreadPoolExecutor | None = None


def _dispatch(job_id: str) -> None:
    global _pool
    backend = settings.AERO_JOB_BACKEND
    if backend == "rq":
        import django_rq

        django_rq.get_queue(settings.AERO_QUEUE).enqueue(
            run_export, job_id, job_timeout=1800, result_ttl=0, failure_ttl=86400
        )
    elif backend == "embedded":
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aero-export")
        _pool.submit(_run_in_thread, job_id)
    else:
        run_export(job_id)


def _run_in_thread(job_id: str) -> None:
    try:
        run_export(job_id)
    finally:
        connections.close_all()


def run_export(job_id: str) -> str:
    """Render the export and keep it for download. Idempotent: a finished job is left
    alone. Returns the job's final status."""
    job = get_job(job_id)
    if job is None or job.status == "done":
        return job.status if job else "missing"
    job.status = "running"
    _save(job)

    def progress(done: int, total: int) -> None:
        job.done, job.total = done, total
        _save(job)

    try:
        session = Session.objects.select_related("scenario", "scenario_version", "created_by").get(
            pk=job.session_id
        )
        user = User.objects.get(pk=job.user_id)
        with translation.override(job.language):
            text = render_export(session, user, masked=job.masked, progress=progress)
    except Exception as exc:
        logger.exception("export %s failed", job_id)
        job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"
        _save(job)
        return job.status
    shared_cache("replay").set(_key(job_id) + ":body", text, timeout=EXPORT_TTL)
    job.status, job.sha256 = "done", digest(text)
    _save(job)
    return job.status


def audit_export(session: Session, user: Any, text: str, *, masked: bool, mode: str) -> None:
    """Every export that leaves the system is an audit entry (tech plan §7)."""
    audit(
        "session.exported",
        obj=session,
        actor=user,
        session_id=session.pk,
        detail={"sha256": digest(text), "events": session.last_seq, "masked": masked, "mode": mode},
    )
