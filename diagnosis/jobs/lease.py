"""A session's lease: one job at a time per session. A row on the session (token, end,
holder "host:pid"), taken by one UPDATE that also inserts the job's root run and reads
the world's and the provider configs' stamps; renewed by the process's lease keeper (one
thread beating for every job of the process); let go with the root run's end in one
statement. Every write the job makes is fenced by the token (diagnosis.events)."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, connections
from django.db.models import Q
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from aero.compiled import Arg, Compiled, Statement, slot
from diagnosis.jobs.world import WORLD_STAMP_COLUMNS, world_stamp, world_stamp_sql
from diagnosis.models import ENDED_STATUSES, AgentRun, Session
from scenarios_admin.models import ProviderConfig

logger = logging.getLogger("diagnosis.jobs")


def lease_is_live(session_id: Any) -> bool:
    return Session.objects.filter(
        pk=session_id, lease_token__isnull=False, lease_expires_at__gt=timezone.now()
    ).exists()


def lease_holder() -> str:
    """This process, as a lease records its holder: "host:pid"."""
    return f"{socket.gethostname()}:{os.getpid()}"


def holder_pid(holder: str, host: str) -> int | None:
    """The pid in a "host:pid" holder on this host, else None."""
    name, _, pid = holder.rpartition(":")
    return int(pid) if name == host and pid.isdigit() else None


# The lease's token and the session row as taking it left it.
Leased = tuple[uuid.UUID, Session]
# The agent a job's root run is named for.
ROOT_AGENT = "incident_agent"


def root_snapshot(token: uuid.UUID | None = None) -> dict[str, Any]:
    """What a job's root run records of the process running it (and the status it found,
    added by the caller)."""
    snapshot = {"pid": os.getpid(), "host": socket.gethostname()}
    snapshot["backend"] = settings.AERO_JOB_BACKEND
    if token is not None:
        # Which lease this run holds (the session row names its holder too).
        snapshot["lease"] = str(token)
    return snapshot


def acquire_lease(session_id: Any) -> uuid.UUID | None:
    taken = take_lease(session_id)
    return taken[0] if taken is not None else None


def take_lease(session_id: Any, *, root: dict[str, Any] | None = None) -> Leased | None:
    """The lease and the session row as the lease left it, in one statement (UPDATE ...
    RETURNING): the job reads nothing else of the row to start. `root`: the
    input snapshot of the job's root run, inserted by the same statement (PostgreSQL),
    with the active world's stamp read there too: the row then carries
    `root_id` (None for an ended session: no run), `world_stamp` and `providers_stamp`.
    Both statements are compiled once per connection."""
    token = uuid.uuid4()
    now = timezone.now()
    values = (session_id, now, token, now + timedelta(seconds=settings.AERO_LEASE_SECONDS))
    if root is None or connection.vendor != "postgresql":
        rows, _ = _lease.run(*values, lease_holder())
        return (token, _session_row.from_row(rows[0], connections["default"])) if rows else None
    snapshot = json.dumps({**root, "lease": str(token)})
    rows, _ = _lease_and_root.run(*values, lease_holder(), timezone.now(), snapshot)
    if not rows:
        return None
    row = rows[0]
    leased = _session_row.from_row(row, connections["default"])
    # The statement's extra columns, after the session's.
    root_id, *stamp, providers_stamp = row[-(WORLD_STAMP_COLUMNS + 2) :]
    leased.root_id = root_id  # type: ignore[attr-defined]
    leased.providers_stamp = providers_stamp  # type: ignore[attr-defined]
    leased.world_stamp = world_stamp(tuple(stamp))  # type: ignore[attr-defined]
    return token, leased


# The session's row as a job reads it: every column, converted as Django converts them.
_session_row = Compiled(Session, lambda: Session.objects.all())


def _lease_update(connection: Any) -> tuple[str, list[Any], str]:
    """The lease's UPDATE ... RETURNING the row, its values the statement's first five:
    the session, now, the token, the lease's end, the holder."""
    field = Session._meta.get_field
    update = UpdateQuery(Session)
    update.add_q(
        Q(pk=Arg(0, Session._meta.pk))
        & (Q(lease_token__isnull=True) | Q(lease_expires_at__lt=Arg(1, field("lease_expires_at"))))
    )
    update.add_update_values(
        {
            "lease_token": Arg(2, field("lease_token")),
            "lease_expires_at": Arg(3, field("lease_expires_at")),
            # In the same statement: from the moment the lease is taken the reconciler
            # can tell that its holder died.
            "lease_holder": Arg(4),
        }
    )
    sql, params = update.get_compiler(connection=connection).as_sql()
    quote = connection.ops.quote_name
    columns = ", ".join(quote(str(f.column)) for f in Session._meta.concrete_fields)
    return sql, list(params), columns


def _lease_sql(connection: Any) -> tuple[str, list[Any]]:
    sql, params, columns = _lease_update(connection)
    return f"{sql} RETURNING {columns}", params


def _lease_and_root_sql(connection: Any) -> tuple[str, list[Any]]:
    """The lease, the root run's INSERT (its start and input snapshot: the statement's
    values 6 and 7), the active world's stamp (diagnosis.jobs.world) and the
    provider configs'."""
    sql, params, columns = _lease_update(connection)
    quote = connection.ops.quote_name
    run = AgentRun._meta

    def column(meta: Any, name: str) -> str:
        return quote(str(meta.get_field(name).column))

    names = ("session", "agent_name", "mode", "status", "started_at", "input_snapshot")
    inserted = ", ".join(column(run, name) for name in (*names, "output_summary"))
    ended = ", ".join(["%s"] * len(ENDED_STATUSES))
    status = column(Session._meta, "status")
    world_join, world_columns = world_stamp_sql(connection)
    return (
        f"WITH leased AS ({sql} RETURNING {columns}),"
        f" root AS (INSERT INTO {quote(run.db_table)} ({inserted})"
        # A session whose run mode was chosen (a pack's `run_mode` in its snapshot)
        # runs each job's root run in it.
        f"  SELECT leased.{quote('id')}, %s,"
        f"   coalesce(leased.{column(Session._meta, 'snapshot')} #>> '{{run_mode,mode}}', %s),"
        f"   %s, %s,"
        f"   jsonb_build_object('status', leased.{status}) || %s::jsonb, %s::jsonb"
        f"  FROM leased WHERE leased.{status} NOT IN ({ended}) RETURNING {quote('id')})"
        f" SELECT leased.*, (SELECT {quote('id')} FROM root) AS root_id,"
        f" {world_columns}, providers.providers_stamp"
        f" FROM leased{world_join}"
        # Every provider config row, whole, as one digest: any change to one
        # changes it, so the job reads the configs only when they changed.
        f" CROSS JOIN (SELECT md5(coalesce(string_agg(p::text, ',' ORDER BY p.{quote('id')}),"
        f" '')) AS providers_stamp FROM {quote(ProviderConfig._meta.db_table)} p) providers",
        [
            *params,
            ROOT_AGENT,
            run.get_field("mode").get_default(),
            run.get_field("status").get_default(),
            slot(5, run.get_field("started_at")),
            slot(6),
            json.dumps(run.get_field("output_summary").get_default()),
            *sorted(ENDED_STATUSES),
        ],
    )


_lease = Statement(_lease_sql)
_lease_and_root = Statement(_lease_and_root_sql)


def renew_lease(session_id: Any, token: uuid.UUID) -> bool:
    """Extend the lease if it is still ours; False once it is gone."""
    renewed = Session.objects.filter(pk=session_id, lease_token=token).update(
        lease_expires_at=timezone.now() + timedelta(seconds=settings.AERO_LEASE_SECONDS)
    )
    return bool(renewed)


def heartbeat_interval() -> float:
    # Read per job: tests and operators shorten the lease without touching the beat.
    return float(min(settings.AERO_HEARTBEAT_SECONDS, settings.AERO_LEASE_SECONDS / 3))


class Heartbeat:
    """Renews a job's lease every heartbeat_interval() while the job runs, from the
    process's lease keeper (a thread of its own), so a long step (a slow model call)
    keeps the lease; a worker that dies or is paused stops beating and its lease runs
    out. Losing the lease is noticed by the job's next write (the fence), not here: this
    only records it for the log.

    One keeper thread per process serves every job's heartbeat: a thread
    started and joined per job cost each job two hand-offs between threads, on the path
    of every session queued behind it."""

    def __init__(
        self, session_id: str, token: uuid.UUID, beat: Callable[[], bool] | None = None
    ) -> None:
        self.session_id = session_id
        self.token = token
        # What renews it: the session's lease, or a child job's claim (child_jobs).
        self.renew = beat or (lambda: renew_lease(session_id, token))
        self.lost = threading.Event()
        self.interval = heartbeat_interval()
        self.due = 0.0  # monotonic time of the next renewal

    def __enter__(self) -> Heartbeat:
        self.due = time.monotonic() + self.interval
        _lease_keeper().add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        # Waits for a renewal of this lease under way: the release comes after it.
        _lease_keeper().remove(self)

    def beat(self) -> bool:
        return self.renew()


class _LeaseKeeper:
    """The thread that renews the leases of the jobs running in this process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.changed = threading.Condition()
        self.beats: list[Heartbeat] = []
        self.beating: Heartbeat | None = None
        self.wake_at = 0.0  # monotonic time the keeper sleeps until (0: awake)
        self.idle = 1.0  # how long it sleeps with no beat: the shortest interval seen
        self.thread = threading.Thread(target=self._run, daemon=True, name="aero-lease-keeper")
        self.thread.start()

    def add(self, beat: Heartbeat) -> None:
        with self.changed:
            self.beats.append(beat)
            self.idle = min(self.idle, beat.interval)
            # Woken only if it would sleep past this beat: a job's start is not a hand-off
            # to the keeper's thread (the GIL's and the OS's), most jobs end before it.
            if beat.due < self.wake_at:
                self.changed.notify_all()

    def remove(self, beat: Heartbeat) -> None:
        with self.changed:
            while self.beating is beat:
                self.changed.wait()
            # Not woken: sleeping until a removed beat's time, it then finds none due.
            self.beats = [known for known in self.beats if known is not beat]

    def _next(self) -> Heartbeat:
        """The first heartbeat due, once it is (marked as being beaten)."""
        with self.changed:
            while True:
                now = time.monotonic()
                if self.beats:
                    beat = min(self.beats, key=lambda known: known.due)
                    if beat.due <= now:
                        self.wake_at = now
                        self.beating = beat
                        return beat
                    self.wake_at = beat.due
                else:
                    # Idle: a look every shortest interval seen, so that a job's beat,
                    # due an interval after it starts, needs no wake-up call.
                    self.wake_at = now + self.idle
                self.changed.wait(self.wake_at - now)

    def _run(self) -> None:
        while True:
            beat = self._next()
            lost = False
            try:
                if not beat.beat():
                    lost = True
                    beat.lost.set()
                    logger.warning("session %s: the job lost its lease", beat.session_id)
            except DatabaseError:
                # PostgreSQL restarting: keep trying; the fence refuses the job's
                # writes if the lease runs out meanwhile.
                logger.warning("session %s: lease renewal failed", beat.session_id)
            except Exception:
                logger.exception("session %s: lease renewal failed", beat.session_id)
            finally:
                # Renewals are seconds apart and most jobs never need one: no connection
                # is kept open between them.
                connections.close_all()
                with self.changed:
                    self.beating = None
                    if lost:
                        self.beats = [known for known in self.beats if known is not beat]
                    else:
                        beat.due = time.monotonic() + beat.interval
                    self.changed.notify_all()


_keeper: _LeaseKeeper | None = None
_keeper_lock = threading.Lock()


def _lease_keeper() -> _LeaseKeeper:
    """This process's keeper, started at its first job (a forked child starts its own:
    threads do not survive a fork)."""
    global _keeper
    with _keeper_lock:
        if _keeper is None or _keeper.pid != os.getpid():
            _keeper = _LeaseKeeper()
        return _keeper


def release_lease(session_id: Any, token: uuid.UUID, finished: RootEnd | None = None) -> None:
    """Let the lease go. `finished`: the job's root run, marked ended in the same
    statement (a data-modifying CTE on PostgreSQL): one round trip, not two.
    Compiled once per connection."""
    if finished is None:
        _release.run(session_id, token)
        return
    root_id, fence, end = finished
    ending = (root_id, end["status"], end["ended_at"], end["output_summary"])
    if connection.vendor != "postgresql":
        if fence is not None:
            _end_root.run(*ending, fence)
        else:
            _end_ended_root.run(*ending)
        _release.run(session_id, token)
        return
    if fence is not None:
        _end_root_and_release.run(*ending, fence, session_id, token)
    else:
        _end_ended_root_and_release.run(*ending, session_id, token)


# A job's root run to mark ended with the lease's release: its pk, the lease token the
# session must still hold for the run to be marked (None: the job ended the session, its
# lease is cleared), and its end (status, ended_at, output_summary).
RootEnd = tuple[int, uuid.UUID | None, dict[str, Any]]

_RUN = AgentRun._meta.get_field
_SESSION = Session._meta.get_field
_RELEASED = {"lease_token": None, "lease_expires_at": None, "lease_holder": ""}


def _root_end(first: int, fenced: bool) -> tuple[Any, dict[str, Any]]:
    """The root run's UPDATE, its values from the statement's `first`: the run, its
    status, ended_at and output summary, then (fenced) the lease it must still hold:
    fenced in the statement itself (no extra query), as an ended session has no lease
    any more and a waiting one still has ours unless another job took it."""
    runs = AgentRun.objects.filter(pk=Arg(first, AgentRun._meta.pk))
    if fenced:
        runs = runs.filter(session__lease_token=Arg(first + 4, _SESSION("lease_token")))
    return runs, {
        "status": Arg(first + 1),
        "ended_at": Arg(first + 2, _RUN("ended_at")),
        "output_summary": Arg(first + 3, _RUN("output_summary")),
    }


def _releases(first: int) -> Any:
    """The sessions whose lease to let go: the session and the token, from `first`."""
    return Session.objects.filter(
        pk=Arg(first, Session._meta.pk), lease_token=Arg(first + 1, _SESSION("lease_token"))
    )


def _both_sql(fenced: bool) -> Callable[[Any], tuple[str, list[Any]]]:
    def build(connection: Any) -> tuple[str, list[Any]]:
        run_sql, run_params = _update_sql(*_root_end(0, fenced), connection)
        release_sql, release_params = _update_sql(
            _releases(5 if fenced else 4), _RELEASED, connection
        )
        return f"WITH root_run AS ({run_sql}) {release_sql}", [*run_params, *release_params]

    return build


def _one_sql(
    rows: Callable[[], tuple[Any, dict[str, Any]]],
) -> Callable[[Any], tuple[str, list[Any]]]:
    def build(connection: Any) -> tuple[str, list[Any]]:
        return _update_sql(*rows(), connection)

    return build


_release = Statement(_one_sql(lambda: (_releases(0), _RELEASED)))
_end_root = Statement(_one_sql(lambda: _root_end(0, True)))
_end_ended_root = Statement(_one_sql(lambda: _root_end(0, False)))
_end_root_and_release = Statement(_both_sql(True))
_end_ended_root_and_release = Statement(_both_sql(False))


def _update_sql(rows: Any, values: dict[str, Any], connection: Any) -> tuple[str, list[Any]]:
    """The UPDATE Django would run for `rows.update(**values)`, compiled, not run."""
    query = rows.query.chain(UpdateQuery)
    query.add_update_values(values)
    query.clear_select_clause()  # as QuerySet.update does
    sql, params = query.get_compiler(connection=connection).as_sql()
    return sql, list(params)
