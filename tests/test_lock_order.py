"""One lock order for sessions, jobs and approvals (docs/lock-order.md): decisions racing
a running job never deadlock. Each of 40 rounds, on a fresh session, 20 approvers'
clients POST the same decision of its first approval (and its confirmation) again and
again while the job the winning one started runs (inline backend: in the winning
request's thread): no deadlock, no 5xx (409 for every duplicate), every approved action
executed once, no session failed."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import pytest
from django.contrib.auth.models import User
from django.db import connections
from django.test import Client

from approvals.actions import do_decide
from approvals.models import Approval, ApprovalStatus
from diagnosis.events import set_status
from diagnosis.jobs import enqueue as job_enqueue
from diagnosis.jobs import reconciler
from diagnosis.models import Outbox, OutboxStatus, Session, SessionStatus, ToolCall
from tests.api_helpers import token_for
from tests.web_helpers import approval_for, waiting_session

pytestmark = pytest.mark.services

# With the locks in the old order (a decision locking the call with its approval, the
# job's call row before its session) this failed in 23 runs of 23, in round 0 (11 runs)
# to round 18: 40 rounds keep a margin past that; 100 took 2.5 minutes of a CI worker.
ROUNDS = 40
CLIENTS = 20
# How often each client re-POSTs while the winning request (and its job) runs, and how
# long it waits between two: the work of a round stays bounded, and 19 clients posting
# flat out on a small machine would slow the job they race to a crawl.
MAX_POSTS = 40
PAUSE = 0.1


def race(approval: Approval, token: str, approvers: ThreadPoolExecutor) -> list[int]:
    """CLIENTS threads POST the approval's next step at once, then again until the one
    that was recorded (its request runs the job) has answered. The statuses, in order."""
    step = "confirm" if approval.status == ApprovalStatus.CONFIRMING else "approve"
    url = f"/api/v1/approvals/{approval.pk}/{step}"
    body = json.dumps({"digest": approval.digest, "reason": "approved in the race"})
    barrier = threading.Barrier(CLIENTS)
    decided = threading.Event()
    statuses: list[int] = []
    lock = threading.Lock()

    def client() -> None:
        http = approver_client()
        barrier.wait(timeout=30)
        for _ in range(MAX_POSTS):
            try:
                status = http.post(
                    url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}"
                ).status_code
            except Exception:  # the test client re-raises what became a 500
                status = 500
            with lock:
                statuses.append(status)
            if status == 200:
                decided.set()
                return
            if decided.wait(PAUSE):
                return

    for future in [approvers.submit(client) for _ in range(CLIENTS)]:
        future.result(timeout=120)
    return statuses


_approver = threading.local()


def approver_client() -> Client:
    """The approver thread's own test client, made at its first race. A client builds
    its request handler (the whole middleware chain) at its first request, as a server
    does once per process: a client per POST spent more CPU on that than on the
    decision, under the GIL the job it races needs."""
    if not hasattr(_approver, "client"):
        _approver.client = Client()
    return cast(Client, _approver.client)


def close_connections(approvers: ThreadPoolExecutor) -> None:
    """Every approver thread closes its database connection: one task each (the barrier
    holds each task until all CLIENTS run at once, so no thread takes two)."""
    barrier = threading.Barrier(CLIENTS)

    def close() -> None:
        barrier.wait(timeout=30)
        connections.close_all()

    for future in [approvers.submit(close) for _ in range(CLIENTS)]:
        future.result(timeout=60)


def play_round(round_number: int, olga: User, token: str, approvers: ThreadPoolExecutor) -> None:
    session = waiting_session(olga)
    first = Approval.objects.filter(session=session).order_by("pk").first()
    assert first is not None, f"round {round_number}: no approval to race"
    # One approval per round (its confirmation too when it takes two steps): the
    # decision whose job runs while the duplicates arrive, so a round's work is bounded.
    while True:
        approval = Approval.objects.get(pk=first.pk)
        if approval.status not in ("pending", "confirming"):
            break
        statuses = race(approval, token, approvers)
        where = f"round {round_number}, approval {approval.pk}: {statuses}"
        assert statuses.count(200) == 1, where
        assert set(statuses) <= {200, 409}, where
    session.refresh_from_db()
    assert session.status != SessionStatus.FAILED, f"round {round_number}"
    for approval in Approval.objects.filter(session=session, status="approved"):
        tool_call = ToolCall.objects.get(pk=approval.tool_call_id)
        assert (tool_call.status, tool_call.attempts) == ("completed", 1), tool_call
        (outbox,) = Outbox.objects.filter(tool_call=tool_call)
        assert outbox.status == OutboxStatus.DONE


def test_duplicate_decisions_racing_a_running_job_never_deadlock(
    builtin: None, make_user: Callable[..., User], caplog: pytest.LogCaptureFixture
) -> None:
    olga, bea = make_user("olga", "operator"), make_user("bea", "approver")
    token = token_for(bea)
    caplog.set_level(logging.WARNING)
    # The approvers' threads, each with its client and connection, serve every round.
    with ThreadPoolExecutor(CLIENTS, thread_name_prefix="approver") as approvers:
        try:
            for round_number in range(ROUNDS):
                play_round(round_number, olga, token, approvers)
        finally:
            close_connections(approvers)
    problems = [
        r.getMessage()
        for r in caplog.records
        if "deadlock" in (r.getMessage() + str(r.exc_info and r.exc_info[1])).lower()
        or (r.name == "django.request" and r.levelno >= logging.ERROR)
    ]
    assert problems == []
    assert not Session.objects.filter(status=SessionStatus.FAILED).exists()


def test_a_failed_session_with_approved_actions_pending_is_resumed(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that gave up after a decision left an approved action undone: the reconciler
    resumes the session (as POST .../resume would) and the action runs once."""
    session = waiting_session(make_user("olga", "operator"))
    crew = approval_for(session, "dispatch_cleanup_crew")
    with monkeypatch.context() as patched:
        # The decision commits; its job never runs (the worker died), then it is failed.
        patched.setattr(job_enqueue, "dispatch_after_commit", lambda *a, **k: False)
        do_decide(crew.pk, make_user("bea", "approver"), "approve", digest=crew.digest)
    set_status(session.pk, SessionStatus.FAILED, producer="test", reason="the job gave up")
    assert ToolCall.objects.get(pk=crew.tool_call_id).status != "completed"

    assert reconciler.resume_failed_sessions() == 1  # resumed, its job run (inline)
    session.refresh_from_db()
    assert session.status != SessionStatus.FAILED
    tool_call = ToolCall.objects.get(pk=crew.tool_call_id)
    assert (tool_call.status, tool_call.attempts) == ("completed", 1)
    assert reconciler.resume_failed_sessions() == 0
