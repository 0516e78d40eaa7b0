"""Child agents' jobs (diagnosis.agent.child_agents): a child's `LLMRequest` row is its
work and its claim is its lease. A job claims the row (one UPDATE), renews the claim from
the process's lease keeper, runs the pack's child agent with every write fenced by the
claim (diagnosis.eventlog.context), and ends it one of three ways:

- finished: the result stored on the row; under the session's row lock the job checks
  whether a sibling of its join is still pending, and the last one enqueues the session
  (its parent resumes). Every finisher takes that lock, so exactly one sees none left;
  a job killed after its commit and before the enqueue leaves a session the reconciler
  re-enqueues (no live lease, no pending request);
- parked: the child waits for something (a slow tool, the model, the reporter's answer):
  the wait is recorded on the row (and a model or tool request as the runner's row), the
  claim let go; whatever answers it enqueues the session, whose job wakes its children.
  A question moves the session to waiting_user; the job its answer wakes moves it back;
- killed (kill -9): the claim runs out, the reconciler enqueues the row's job again, and
  the child runs again from its start: its runs, events and calls are keyed, so nothing
  is written twice."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from diagnosis import shutdown
from diagnosis.agent import waits
from diagnosis.agent.child_agents import PURPOSE_PREFIX, WAIT_KIND, child_key, child_runner
from diagnosis.agent.providers import configured_providers
from diagnosis.agent.state import AgentContext
from diagnosis.eventlog.names import USER_MESSAGE
from diagnosis.events import LeaseLost, fenced, lock_session, set_status, tracing
from diagnosis.jobs.lease import Heartbeat
from diagnosis.jobs.model_requests import record_model_request
from diagnosis.jobs.rq_queues import drop_job, queue_named
from diagnosis.jobs.world import definition_of, world_of
from diagnosis.models import (
    AgentRun,
    Event,
    LLMRequest,
    LLMRequestStatus,
    Session,
    SessionStatus,
)

logger = logging.getLogger("diagnosis.jobs")

PRODUCER = "agent"
# Sessions whose children may move: a parent waiting for them is running; a child's
# question moves the session to waiting_user until the answer.
_LIVE = (
    SessionStatus.QUEUED,
    SessionStatus.RUNNING,
    SessionStatus.RETRYING,
    SessionStatus.WAITING_USER,
)


def record_wait(session_id: Any, waiting: dict[str, Any]) -> None:
    """A job's request wait recorded (model_requests); for a wait on child agents, a job
    for each child that can go on."""
    record_model_request(session_id, waiting)
    if waiting.get("kind") == WAIT_KIND:
        wake_children(session_id, [c["key"] for c in waiting["children"]])


def wake_children(session_id: Any, keys: list[str] | None = None) -> int:
    """Enqueue a job for each pending child of the session that nobody holds and whose
    own wait (if any) is answered. Returns how many."""
    now = timezone.now()
    rows = LLMRequest.objects.filter(
        session_id=session_id,
        status=LLMRequestStatus.PENDING,
        purpose__startswith=PURPOSE_PREFIX,
    ).filter(Q(claim_token__isnull=True) | Q(claim_expires_at__lt=now))
    if keys is not None:
        rows = rows.filter(key__in=keys)
    woken = 0
    for key, request in rows.values_list("key", "request"):
        if can_go_on(session_id, request) and enqueue_child(session_id, key):
            woken += 1
    return woken


def can_go_on(session_id: Any, request: dict[str, Any]) -> bool:
    """Whether a parked child's wait is answered (a child never parked can go on)."""
    waiting = request.get("waiting")
    if not waiting:
        return True
    if waiting["kind"] == "question":
        return Event.objects.filter(
            session_id=session_id, type=USER_MESSAGE, seq__gt=waiting.get("after") or 0
        ).exists()
    return (
        LLMRequest.objects.filter(key=waiting["key"])
        .exclude(status=LLMRequestStatus.PENDING)
        .exists()
    )


class _Handed:
    """How sessions are dispatched and embedded jobs submitted, handed in by
    diagnosis.jobs.enqueue (`hand_in`): it runs children in its inline loop, so it sits
    above this module, which cannot import it back."""

    dispatch_after_commit: Callable[[Any], bool]
    embedded_submit: Callable[..., Any]


_handed = _Handed()


def hand_in(
    dispatch_after_commit: Callable[[Any], bool], embedded_submit: Callable[..., Any]
) -> None:
    """Called by diagnosis.jobs.enqueue when it is imported (the diagnosis.jobs package
    imports it, so any import of this module has it)."""
    _handed.dispatch_after_commit = dispatch_after_commit
    _handed.embedded_submit = embedded_submit


def child_job_id(key: str) -> str:
    return "aero-child-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def enqueue_child(session_id: Any, key: str) -> bool:
    """A job for the child `key` by the configured backend; a second one is harmless (the
    claim lets one run). The inline backend runs children from its own loop
    (`run_children_inline`)."""
    backend = settings.AERO_JOB_BACKEND
    if backend == "inline":
        return False
    if backend == "embedded":
        _handed.embedded_submit(_run_closing, str(session_id), key)
        return True
    return _enqueue_rq(str(session_id), key)


def _run_closing(session_id: str, key: str) -> None:
    try:
        run_child_job(session_id, key)
    except Exception:
        logger.exception("child job %s crashed", key)
    finally:
        connections.close_all()


def _enqueue_rq(session_id: str, key: str) -> bool:
    from rq.exceptions import DuplicateJobError, NoSuchJobError
    from rq.job import Job

    queue = queue_named(settings.AERO_QUEUE)
    for _ in range(3):
        try:
            queue.enqueue(
                run_child_job,
                session_id,
                key,
                job_id=child_job_id(key),
                unique=True,
                job_timeout=600,
                result_ttl=60,
                failure_ttl=86400,
            )
            return True
        except DuplicateJobError:
            pass
        try:
            job = Job.fetch(child_job_id(key), connection=queue.connection)
        except NoSuchJobError:
            continue
        if job.get_status() in ("queued", "deferred", "scheduled"):
            return False  # it will run and claim the row
        # Finished, failed, or started by a worker that lost the claim (the caller only
        # wakes rows nobody holds): the id is free for the next job.
        drop_job(job)
    return False


def run_child_job(session_id: str, key: str, *, enqueue: bool = True) -> str:
    """Run the child `key` if nobody holds it. Returns "done", "failed", "parked",
    "busy" (held, answered or gone), "lease_lost" or "stopped". `enqueue`: the last
    child enqueues its session (the inline backend's loop runs the session itself)."""
    if shutdown.stopping():
        return "stopped"
    claimed = _claim(key)
    if claimed is None:
        return "busy"
    row, token = claimed
    request = row.request
    result: dict[str, Any] | None = None
    error = ""
    try:
        with (
            Heartbeat(session_id, token, beat=lambda: _renew(row.pk, token)),
            fenced(session_id, token, claim=row.pk),
            tracing(),
        ):
            ctx = _context(row)
            if (request.get("waiting") or {}).get("kind") == "question":
                # Woken by the answer: the session is at work again.
                set_status(session_id, SessionStatus.RUNNING, producer=PRODUCER, strict=False)
            try:
                with waits.wait_scope(session_id, key):
                    result = child_runner(request["child"])(ctx, key, request.get("args") or {})
            except waits.ModelWait as wait:
                _park(row, token, wait.payload)
                return "parked"
            except (LeaseLost, shutdown.WorkerStopping):
                raise
            except Exception as exc:
                logger.exception("child %s failed (claim %s)", key, row.claims)
                if row.claims < settings.AERO_JOB_ATTEMPTS:
                    _let_go(row.pk, token)  # the reconciler runs it again
                    return "retrying"
                error = f"{type(exc).__name__}: {exc}"
        # After the claim's last renewal: the row's end lets the claim go.
        _finish(row, token, result, error, enqueue)
        return "done" if result is not None else "failed"
    except LeaseLost:
        logger.warning("child %s: its claim was taken over or its session ended", key)
        return "lease_lost"
    except shutdown.WorkerStopping:
        _let_go(row.pk, token)
        return "stopped"


def _claim(key: str) -> tuple[LLMRequest, uuid.UUID] | None:
    token = uuid.uuid4()
    now = timezone.now()
    claimed = (
        LLMRequest.objects.filter(
            key=key, status=LLMRequestStatus.PENDING, purpose__startswith=PURPOSE_PREFIX
        )
        .filter(Q(claim_token__isnull=True) | Q(claim_expires_at__lt=now))
        .filter(session__status__in=_LIVE)
        .update(
            claim_token=token,
            claim_expires_at=now + timedelta(seconds=settings.AERO_LLM_CLAIM_SECONDS),
            claims=F("claims") + 1,
        )
    )
    if not claimed:
        return None
    return LLMRequest.objects.get(key=key), token


def _renew(pk: int, token: uuid.UUID) -> bool:
    return bool(
        LLMRequest.objects.filter(pk=pk, claim_token=token, status=LLMRequestStatus.PENDING).update(
            claim_expires_at=timezone.now() + timedelta(seconds=settings.AERO_LLM_CLAIM_SECONDS)
        )
    )


def _let_go(pk: int, token: uuid.UUID) -> None:
    LLMRequest.objects.filter(pk=pk, claim_token=token).update(
        claim_token=None, claim_expires_at=None
    )


def _context(row: LLMRequest) -> AgentContext:
    """What the child's steps run with: the session's definition, world and providers,
    and the parent's run (the child's run is made under it)."""
    session = Session.objects.get(pk=row.session_id)
    definition = definition_of(session)
    parent = AgentRun(pk=row.request["parent"], session_id=session.pk)
    parent._state.adding = False
    return AgentContext(
        session_id=session.pk,
        definition=definition,
        graph=world_of(definition["kind"]),
        providers=configured_providers(),
        root_run=parent,
        producer=PRODUCER,
        parent_run=parent,
        child_job=True,
    )


def _park(row: LLMRequest, token: uuid.UUID, waiting: dict[str, Any]) -> None:
    """The child waits: a model or tool request recorded for the runner (fenced by the
    claim), the wait written on the child's row, the claim let go."""
    if waiting["kind"] in ("model", "tool"):
        record_model_request(row.session_id, waiting)
    parked = {"kind": waiting["kind"], "key": waiting["key"], "after": waiting.get("after")}
    with transaction.atomic():
        lock_session(row.session_id)
        if waiting["kind"] == "question":
            # The reporter is asked: the session waits for them (its page's answer box),
            # under the claim, before the claim goes.
            set_status(row.session_id, SessionStatus.WAITING_USER, producer=PRODUCER, strict=False)
        moved = LLMRequest.objects.filter(
            pk=row.pk, claim_token=token, status=LLMRequestStatus.PENDING
        ).update(
            request={**row.request, "waiting": parked}, claim_token=None, claim_expires_at=None
        )
        if not moved:
            raise LeaseLost(f"child {row.key}: claim lost")
    if waiting["kind"] in ("model", "tool") and can_go_on(
        row.session_id, row.request | {"waiting": parked}
    ):
        enqueue_child(row.session_id, row.key)  # answered meanwhile: nobody else wakes it


def _finish(
    row: LLMRequest, token: uuid.UUID, result: dict[str, Any] | None, error: str, enqueue: bool
) -> bool:
    """The child's result (or failure) on its row; the last of its join enqueues the
    session. Returns whether it was the last."""
    join = row.request["join"]
    with transaction.atomic():
        session = lock_session(row.session_id)
        done = LLMRequest.objects.filter(
            pk=row.pk, claim_token=token, status=LLMRequestStatus.PENDING
        ).update(
            status=LLMRequestStatus.DONE if result is not None else LLMRequestStatus.FAILED,
            reply={"result": result} if result is not None else None,
            error=error,
            finished_at=timezone.now(),
            claim_token=None,
            claim_expires_at=None,
        )
        if not done:
            raise LeaseLost(f"child {row.key}: claim lost")
        last = not LLMRequest.objects.filter(
            key__startswith=child_key(join, ""), status=LLMRequestStatus.PENDING
        ).exists()
        if last and enqueue and not session.is_ended:
            session_id = row.session_id
            transaction.on_commit(lambda: _handed.dispatch_after_commit(session_id))
    return last


def run_children_inline(session_id: Any) -> bool:
    """The inline backend: run the session's children that can go on, here, one after
    the other. Whether any ran."""
    ran = False
    rows = LLMRequest.objects.filter(
        session_id=session_id, status=LLMRequestStatus.PENDING, purpose__startswith=PURPOSE_PREFIX
    ).order_by("pk")
    for key, request in list(rows.values_list("key", "request")):
        if can_go_on(session_id, request):
            outcome = run_child_job(str(session_id), key, enqueue=False)
            ran = ran or outcome in ("done", "failed", "retrying", "parked")
    return ran


def requeue_children() -> int:
    """The reconciler's pass: a job for every child that can go on and has none (its
    worker killed, its job lost, its wake-up never sent)."""
    if settings.AERO_JOB_BACKEND == "inline":
        return 0
    now = timezone.now()
    sessions = (
        LLMRequest.objects.filter(
            status=LLMRequestStatus.PENDING,
            purpose__startswith=PURPOSE_PREFIX,
            session__status__in=_LIVE,
        )
        .filter(Q(claim_token__isnull=True) | Q(claim_expires_at__lt=now))
        .values_list("session_id", flat=True)
        .distinct()
    )
    woken = 0
    for session_id in list(sessions):
        try:
            woken += wake_children(session_id)
        except Exception:
            logger.exception(
                "session %s: waking its children failed; the next pass retries", session_id
            )
    return woken
