"""What the fault tests do to AERO, run as `python -m tests.faults.driver <command>` in a
process of its own against the fault suite's PostgreSQL and Redis (the environment
says where). Prints one JSON line: its result.

`python -m tests.faults.driver serve` is the same, kept running: one command a line on
stdin (a JSON list), one answer a line on stdout after SERVE_MARK. The suite talks to
one such process instead of starting Python and Django for every step (seconds each on a
busy machine); its connections are closed after every command, so a PostgreSQL restart
between two commands costs nothing."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import traceback
from collections import Counter
from typing import Any

import django

django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.db import connections  # noqa: E402
from django.test import Client  # noqa: E402
from django.utils import translation  # noqa: E402

from aero.roles import ensure_role_groups  # noqa: E402
from approvals.actions import do_decide  # noqa: E402
from approvals.models import Approval  # noqa: E402
from diagnosis import events  # noqa: E402
from diagnosis.actions import ActionError, do_create_session  # noqa: E402
from diagnosis.eventlog import write as event_write  # noqa: E402
from diagnosis.models import Event, Session, ToolCall  # noqa: E402
from scenarios_admin.builtin import load_builtin_data  # noqa: E402
from scenarios_admin.models import ProviderConfig, Scenario  # noqa: E402
from tests.faults.cluster import SERVE_MARK  # noqa: E402

# Fuel leak at a stand, engines running, still leaking: the agent proposes actions that
# wait for approvers (tests/web_helpers.py).
MESSAGE = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"
APPROVERS = 50


def setup(fake_llm_url: str) -> dict[str, Any]:
    load_builtin_data()
    ensure_role_groups()
    operator = User.objects.create_user("olga")
    operator.groups.add(Group.objects.get(name="operator"))
    approvers = Group.objects.get(name="approver")
    for number in range(APPROVERS):
        # No password (no hashing: 50 users): the driver acts for them directly.
        User.objects.create_user(f"approver{number}").groups.add(approvers)
    config = ProviderConfig(
        name="slow", kind="openai", base_url=fake_llm_url, model="fake-1", retries=1
    )
    config.set_api_key("sk-faults")
    config.save()
    return {"ok": True}


def create(count: str) -> list[str]:
    operator = User.objects.get(username="olga")
    scenario = Scenario.objects.get(slug="oil_spill")
    return [str(do_create_session(operator, scenario, MESSAGE).pk) for _ in range(int(count))]


def approve_all() -> int:
    """Approve (and confirm) every open approval, as approvers would."""
    approver = User.objects.get(username="approver0")
    decided = 0
    while True:
        open_ = list(Approval.objects.filter(status__in=["pending", "confirming"]).order_by("pk"))
        if not open_:
            return decided
        for approval in open_:
            step = "confirm" if approval.status == "confirming" else "approve"
            reason = "approved by the fault suite"
            try:
                do_decide(approval.pk, approver, step, reason, digest=approval.digest)
                decided += 1
            except ActionError:
                pass  # decided meanwhile (a re-run); the loop reads the rows again


def report(*session_ids: str) -> dict[str, Any]:
    """Per session: status, whether seq is gap-free and unique, and each approved
    action's executions (tool.call_completed events per tool call)."""
    sessions: dict[str, Any] = {}
    for session in Session.objects.filter(pk__in=session_ids):
        seqs = list(Event.objects.filter(session=session).values_list("seq", flat=True))
        executed = Counter(
            e.payload.get("tool_call")
            for e in Event.objects.filter(session=session, type="tool.call_completed")
        )
        actions = ToolCall.objects.filter(session=session, is_action=True)
        sessions[str(session.pk)] = {
            "status": session.status,
            "seq_ok": sorted(seqs) == list(range(1, len(seqs) + 1)),
            "events": len(seqs),
            "approved": Approval.objects.filter(session=session, status="approved").count(),
            "executions": {str(a.pk): executed.get(a.pk, 0) for a in actions},
        }
    return sessions


def race(session_id: str) -> dict[str, Any]:
    """50 approvers decide one approval at the same moment, each on its own connection."""
    # One step (R1): every other approver's decision comes after it is decided.
    approval = (
        Approval.objects.filter(session_id=session_id, status="pending")
        .order_by("risk_class")
        .first()
    )
    assert approval is not None, "no pending approval"
    barrier = threading.Barrier(APPROVERS)
    outcomes: list[str] = []

    def decide(number: int) -> None:
        user = User.objects.get(username=f"approver{number}")
        # The refusals are worded in the active language (zh-hans by default, and per
        # thread): the test reads the English ones.
        translation.activate("en")
        try:
            barrier.wait(timeout=30)
            do_decide(approval.pk, user, "approve", "race", digest=approval.digest)
            outcomes.append("won")
        except ActionError as exc:
            outcomes.append(f"refused: {exc}")
        except Exception as exc:  # an error, not a clear answer: the test fails on it
            outcomes.append(f"error: {type(exc).__name__}: {exc}")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=decide, args=(n,)) for n in range(APPROVERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    approval.refresh_from_db()
    events = Event.objects.filter(session_id=session_id, payload__tool_call=approval.tool_call_id)
    return {
        "risk_class": approval.risk_class,
        "outcomes": dict(Counter(outcomes)),
        "events": dict(Counter(events.values_list("type", flat=True))),
        "status": approval.status,
        "approver": approval.approver.get_username() if approval.approver else None,
    }


def dump(session_id: str) -> list[str]:
    """A session's log, one line per event, for a failure message."""
    return [
        f"{e.seq} {e.type} {e.producer} {json.dumps(e.payload, ensure_ascii=False)[:160]}"
        for e in Event.objects.filter(session_id=session_id).order_by("seq")
    ]


def diagnose(session_id: str) -> dict[str, Any]:
    """Why a session has not ended, for a failure message: its row (status, lease), its
    rq job as Redis holds it, whether a reconciler pass would pick it up, and the tail
    of its log."""
    from django.utils import timezone

    from diagnosis.jobs import job_id, queued_job_ids, stalled_sessions

    session = Session.objects.get(pk=session_id)
    job: dict[str, Any] = {}
    try:
        import django_rq
        from django.conf import settings
        from rq.job import Job

        redis = django_rq.get_queue(settings.AERO_QUEUE).connection
        found = Job.fetch(job_id(session_id), connection=redis)
        job = {
            "status": str(found.get_status()),
            "worker": found.worker_name,
            "enqueued_at": str(found.enqueued_at),
            "started_at": str(found.started_at),
            "ended_at": str(found.ended_at),
            "exc": (found.exc_info or "")[-1500:],
        }
    except Exception as exc:  # a failure message reports what it can
        job = {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "status": session.status,
        "lease_holder": session.lease_holder,
        "lease_expires_at": str(session.lease_expires_at),
        "now": str(timezone.now()),
        "pending_llm": session.llm_requests.filter(status="pending").count(),
        "stalled": session_id in stalled_sessions(),
        "queued": session_id in queued_job_ids(),
        "job": job,
        "log": dump(session_id)[-15:],
    }


def login() -> str:
    """A session cookie for the operator, as a browser holds after signing in."""
    client = Client()
    client.force_login(User.objects.get(username="olga"))
    return f"sessionid={client.cookies['sessionid'].value}"


class _OverCapacity(logging.Handler):
    """Counts channels_redis's "N of M channels over capacity" (a notice dropped)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.dropped = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "over capacity" in str(record.msg):
            args = record.args if isinstance(record.args, tuple) else ()
            self.dropped += int(str(args[0])) if args else 1


def append(session_id: str, count: str, notices: str = "notices") -> dict[str, Any]:
    """`count` events appended one by one, each in its own transaction and each with its
    notice after commit, as fast as this process goes; with "no-notices", none is
    published (a notice lost whatever the layer: only the viewers' resync can bring it)."""
    if notices == "no-notices":
        event_write.notify_session = lambda *args: None
    counter = _OverCapacity()
    layer_logger = logging.getLogger("channels_redis.core")
    layer_logger.addHandler(counter)
    layer_logger.setLevel(logging.INFO)
    for number in range(int(count)):
        events.append_event(session_id, "agent.note", {"text": f"note {number}"}, producer="faults")
    return {
        "appended": int(count),
        "last_seq": Session.objects.get(pk=session_id).last_seq,
        "dropped_at_publish": counter.dropped,
        "committed_at": time.time(),  # the last one's (same machine, same clock)
    }


def step(*session_ids: str) -> dict[str, Any]:
    """approve-all, then report: one process start instead of two."""
    approve_all()
    return report(*session_ids)


COMMANDS: dict[str, Any] = {
    "step": step,
    "dump": dump,
    "diagnose": diagnose,
    "setup": setup,
    "create": create,
    "approve-all": approve_all,
    "report": report,
    "race": race,
    "login": login,
    "append": append,
}


def serve() -> None:
    for line in sys.stdin:
        command, *args = json.loads(line)
        try:
            answer: dict[str, Any] = {"ok": COMMANDS[command](*args)}
        except Exception:
            answer = {"error": traceback.format_exc()}
        finally:
            connections.close_all()
        print(SERVE_MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        print(json.dumps(COMMANDS[sys.argv[1]](*sys.argv[2:])))
