"""Graph steps written as one transaction (StepGroup)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import transaction
from django.utils import timezone

from aero.compiled import (
    insert_rows,
)
from diagnosis.eventlog.context import (
    RUN_ID_BLOCK,
    EventBatch,
    _batch,
    current_fence,
    current_known,
)
from diagnosis.eventlog.names import SESSION_STATUS_CHANGED
from diagnosis.eventlog.write import (
    _new_event,
    _status_change,
    _write,
    lock_session,
    set_status,
    write_unlocked,
)
from diagnosis.models import (
    SESSION_TRANSITIONS,
    AgentRun,
    Event,
    Session,
)


@contextmanager
def _step_savepoint() -> Iterator[None]:
    """A savepoint a failing step rolls back to, like `atomic()`'s, but not released when
    the step succeeds: the database keeps it until the group commits, one
    statement saved per step. As `atomic()` does, the step's on-commit callbacks carry
    the savepoint, so rolling back to it drops them with its rows."""
    connection = transaction.get_connection()
    sid = connection.savepoint()
    connection.savepoint_ids.append(sid)
    try:
        yield
        if connection.needs_rollback:
            # A database error inside the step that its code caught: the step failed.
            raise transaction.TransactionManagementError("a step swallowed a database error")
    except BaseException:
        connection.savepoint_ids.pop()
        connection.needs_rollback = False
        try:
            connection.savepoint_rollback(sid)
        except Exception:
            connection.needs_rollback = True  # the whole group rolls back (as atomic())
        raise
    connection.savepoint_ids.pop()


class _GroupRolledBack(Exception):
    pass


class StepGroup:
    """Graph steps that follow each other with no wait between them (the rules, the
    impact, the lookups, the proposals...), written as ONE transaction: one row lock,
    one block of seqs, one bulk insert, one session update and one notice after commit
    for all of them. It is opened by the first step and
    committed before anything that ends the graph's run: a wait (the waiting nodes and a
    model wait commit it first), the last node, a failure, the worker stopping; so the
    checkpoint LangGraph saves when the run exits never gets ahead of the log.

    Each step after the first runs in a savepoint: a step that fails or waits for the
    model leaves nothing (its queued events are dropped too), the steps before it
    commit, and its failure is logged on its own. A crash (kill -9) mid-group loses the
    whole group and its checkpoint alike: the next job re-runs those steps from the
    checkpoint, under the same step keys."""

    def __init__(self, session_id: Any) -> None:
        self.session_id = session_id
        self.atomic: Any = None
        self.batch: EventBatch | None = None
        # The node runs its steps finished that already had a row (a re-run step, or a
        # database without sequences): one UPDATE for all of them at the commit.
        self.finished: list[AgentRun] = []
        # The node runs of its steps that have no row yet: inserted in ONE
        # statement at the commit, already completed, with their own timing.
        self.new_runs: list[AgentRun] = []
        # Run ids reserved from the sequence, a block at a time, for `new_runs`: the
        # steps' tool calls, model calls and events name their run before its row is
        # written (the foreign keys are checked at the commit: deferred).
        self.run_ids: list[int] = []
        # A step locked the session row (usage counted): the group ends with it.
        self.end_after_step = False
        # The job's move to `running`, written as the first event of the next group
        # rather than on its own: (from, to, producer) and its queued event.
        self.status: tuple[str, str, str] | None = None
        self.status_event: Event | None = None
        # The move the group's commit ends with (to waiting_user at a human wait):
        # (from, to, producer), its event the group's last.
        self.end_status: tuple[str, str, str] | None = None

    def defer_status(self, previous: str, to: str, producer: str) -> None:
        """Move the session from `previous` to `to` with the next group's commit, its
        event first in the group. `write_status` writes it on its own if no group did."""
        self.status = (previous, to, producer)

    def write_status(self) -> None:
        """The deferred move, written now (no group carried it: no step ran, or the
        first one failed; its failure is logged after it, as before)."""
        if self.status is not None:
            _, to, producer = self.status
            self.status = None
            set_status(self.session_id, to, producer=producer, strict=False)

    def new_run(self, **fields: Any) -> AgentRun | None:
        """A node run to be inserted with the group's commit, its id reserved now; None
        where ids cannot be reserved (SQLite: the caller inserts the row itself)."""
        if transaction.get_connection().vendor != "postgresql":
            return None
        if not self.run_ids:
            known = current_known(self.session_id)
            if known is not None and known.run_ids:
                self.run_ids, known.run_ids = known.run_ids, []
        if not self.run_ids:
            with transaction.get_connection().cursor() as cursor:
                # nextval is not transactional: a block is never handed out twice, and
                # ids a rolled-back step reserved are a gap (ids are not a count). A
                # block per job, so a later job's runs still sort after this one's.
                cursor.execute(
                    "SELECT nextval(pg_get_serial_sequence('diagnosis_agentrun', 'id'))"
                    " FROM generate_series(1, %s)",
                    [RUN_ID_BLOCK],
                )
                self.run_ids = [row[0] for row in cursor.fetchall()]
        run = AgentRun(pk=self.run_ids.pop(0), started_at=timezone.now(), **fields)
        self.new_runs.append(run)
        return run

    def finish_run(self, run: AgentRun, summary: str) -> None:
        """Mark a step's AgentRun completed when the group commits (a step that rolls
        back after this is forgotten: its run is not written, or its row is rolled
        back too and the update finds nothing)."""
        if any(pending is run for pending in self.new_runs):
            run.status = "completed"
            run.ended_at = timezone.now()
            run.output_summary = {"summary": summary}
            return
        self.finished.append(
            AgentRun(
                pk=run.pk,
                status="completed",
                ended_at=timezone.now(),
                output_summary={"summary": summary},
            )
        )

    @property
    def is_open(self) -> bool:
        return self.atomic is not None

    @contextmanager
    def step(self, *, savepoint: bool = True) -> Iterator[EventBatch]:
        """One node's step inside the group (opened here if it is the first).
        `savepoint=False`: for a step that writes no row but its AgentRun (its events
        are only queued): if it fails, its events are dropped and its run row stays in
        the group, for the caller to mark failed; two statements saved per step."""
        first = self.atomic is None
        if first:
            self.atomic = transaction.atomic()
            self.atomic.__enter__()
            self.batch = EventBatch(self.session_id)
            if self.status is not None:
                previous, to, producer = self.status
                self.status_event = _new_event(
                    self.session_id,
                    SESSION_STATUS_CHANGED,
                    {"from": previous, "to": to, "reason": ""},
                    producer=producer,
                )
                self.batch.add(self.status_event)
        batch = self.batch
        assert batch is not None
        mark, finished, runs = len(batch.pending), len(self.finished), len(self.new_runs)
        held = batch.locked
        token = _batch.set(batch)
        try:
            if first or not savepoint:
                yield batch
            else:
                with _step_savepoint():  # this step alone rolls back
                    yield batch
        except BaseException:
            batch.truncate(mark)
            batch.locked = held  # a rolled-back savepoint released the lock taken after it
            del self.finished[finished:]
            del self.new_runs[runs:]  # the failed step's run is the caller's to record
            if first:
                self.rollback()  # nothing else in the group: nothing to keep
            raise
        finally:
            _batch.reset(token)

    def end_with_status(self, previous: str, to: str, producer: str) -> bool:
        """Move the session from `previous` to `to` with this group's commit, its event
        after the group's others (a wait the steps end at). False when no group is open:
        the caller moves it itself. Not written if the session moved meanwhile (only a
        cancel can: it clears the lease, and the commit is refused anyway)."""
        if self.atomic is None or self.batch is None:
            return False
        self.end_status = (previous, to, producer)
        return True

    def commit(self) -> None:
        """Write the group's events (lock, seqs, one insert, one update) and commit."""
        atomic, batch, finished, runs = self.atomic, self.batch, self.finished, self.new_runs
        if atomic is None or batch is None:
            return
        end, self.end_status = self.end_status, None
        self.atomic, self.batch, self.finished, self.new_runs = None, None, [], []
        self.end_after_step = False
        try:
            self._flush(batch, finished, runs, end)
        except BaseException as exc:
            atomic.__exit__(type(exc), exc, exc.__traceback__)
            self._lost()
            raise
        try:
            atomic.__exit__(None, None, None)  # COMMIT: deferred constraints may fail here
        except BaseException:
            self._lost()
            raise

    def _lost(self) -> None:
        fence = current_fence(self.session_id)
        if fence is not None:
            fence.steps_lost = True

    def _flush(
        self,
        batch: EventBatch,
        finished: list[AgentRun],
        runs: list[AgentRun],
        end: tuple[str, str, str] | None = None,
    ) -> None:
        if finished:
            AgentRun.objects.bulk_update(finished, ["status", "ended_at", "output_summary"])
        event = self.status_event
        if not batch.pending:
            if runs:
                insert_rows(AgentRun, runs)  # their ids reserved: nothing read back
            return
        fence = current_fence(self.session_id)
        row = fence.row if fence is not None and fence.claim is None else None
        if (
            batch.locked is not None
            or row is None
            or transaction.get_connection().vendor != "postgresql"
            or not self._write(row, batch, runs, end, unlocked=True)
        ):
            # A step locked the row, or it moved on since the job last wrote it (an
            # event from elsewhere, a lost lease): locked, read and written as always.
            self._write(batch.locked or lock_session(self.session_id), batch, runs, end)
        if event is not None:
            self.status, self.status_event = None, None

    def _write(
        self,
        session: Session,
        batch: EventBatch,
        runs: list[AgentRun],
        end: tuple[str, str, str] | None,
        *,
        unlocked: bool = False,
    ) -> bool:
        """The group's events (with its status moves, as `session` allows them), the
        session's row and the runs: one statement. `unlocked`: `write_unlocked`'s, False
        when it wrote nothing."""
        status, event = self.status, self.status_event
        pending = list(batch.pending)
        fields: dict[str, Any] = {}
        if status is not None and event is not None and pending[0] is event:
            previous, to, producer = status
            if session.status == previous and session.can_transition(to):
                fields, _ = _status_change(session, previous, to, producer)
            else:
                # Moved meanwhile (only a cancel can, and it clears the lease, so the
                # write below is refused anyway): the move is not this group's to write.
                pending.pop(0)
        if end is not None:
            previous, to, producer = end
            current = fields.get("status", session.status)  # after the group's start move
            if current == previous and to in SESSION_TRANSITIONS[current]:
                more, events = _status_change(session, previous, to, producer)
                fields.update(more)
                pending.extend(events)
        # The runs' INSERT rides the events' statement (their ids reserved; the events'
        # foreign keys to them are checked at the commit).
        if unlocked:
            return write_unlocked(session, pending, runs, fields)
        _write(session, pending, runs, **fields)
        return True

    def rollback(self, *, lost: bool = False) -> None:
        """`lost`: steps before the current one are rolled back too (a lost lease): their
        checkpoint must not be saved either."""
        atomic = self.atomic
        if atomic is None:
            return
        if lost:
            self._lost()
        self.atomic, self.batch, self.finished, self.new_runs = None, None, [], []
        self.end_status = None
        self.end_after_step = False
        self.status_event = None  # `status` stays deferred: write_status or the next group
        exc = _GroupRolledBack()
        atomic.__exit__(type(exc), exc, None)
