"""Statements compiled once per connection (aero.compiled): they return what the
queryset returns, compile once, and refuse what they cannot run the same way."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import DatabaseError, connection, connections, transaction
from django.db.models import Exists
from django.db.models.signals import pre_save
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from aero.compiled import (
    AnyOf,
    Arg,
    Compiled,
    CompiledUpdate,
    insert_rows,
    insert_sql,
    insert_values,
    save_fields,
)
from diagnosis.models import Session, WorkerBeat
from scenarios_admin.models import Scenario
from tests.servers import run_embedded

pytestmark = pytest.mark.django_db


NAME = WorkerBeat._meta.get_field("name")
BEAT_AT = WorkerBeat._meta.get_field("beat_at")
SESSION_PK = Session._meta.pk

by_name = Compiled(WorkerBeat, lambda: WorkerBeat.objects.filter(name=Arg(0)))
# A column list (`only`), an ordering, a constant beside the placeholder.
recent = Compiled(
    WorkerBeat,
    lambda: (
        WorkerBeat.objects.filter(beat_at__gte=Arg(0, BEAT_AT), stopping=False)
        .only("name", "pid")
        .order_by("-pid")
    ),
)
pids = Compiled(
    WorkerBeat, lambda: WorkerBeat.objects.filter(host=Arg(0)).order_by("pid").values_list("pid")
)
names = Compiled(
    WorkerBeat,
    lambda: WorkerBeat.objects.filter(host=Arg(0)).order_by("name").values_list("name", flat=True),
)
one_of = Compiled(
    WorkerBeat,
    lambda: WorkerBeat.objects.filter(AnyOf("name", 0), stopping=False).order_by("name"),
)
session_by_pk = Compiled(Session, lambda: Session.objects.filter(pk=Arg(0, SESSION_PK)))
stop = CompiledUpdate(
    WorkerBeat,
    lambda: WorkerBeat.objects.filter(host=Arg(0)),
    {"stopping": True, "beat_at": Arg(1, BEAT_AT)},
)


def beat(name: str, pid: int, *, host: str = "h1", ago: int = 0, stopping: bool = False) -> None:
    now = timezone.now()
    WorkerBeat.objects.create(
        name=name,
        host=host,
        pid=pid,
        started_at=now,
        beat_at=now - timedelta(seconds=ago),
        stopping=stopping,
    )


@pytest.fixture
def beats() -> None:
    beat("w1", 11)
    beat("w2", 12, ago=600)
    beat("w3", 13, stopping=True)
    beat("w4", 14, host="h2")


@pytest.fixture
def compiles() -> Iterator[list[str]]:
    """The SELECTs Django compiles meanwhile, on a connection that has compiled none yet
    (an earlier test's plans are forgotten, as a new connection has none)."""
    connections["default"].__dict__.pop("_aero_compiled", None)
    compiled: list[str] = []
    original = SQLCompiler.as_sql

    def counting(self: SQLCompiler, *args: Any, **kwargs: Any) -> Any:
        sql, params = original(self, *args, **kwargs)
        compiled.append(sql)
        return sql, params

    SQLCompiler.as_sql = counting  # type: ignore[method-assign]
    yield compiled
    SQLCompiler.as_sql = original  # type: ignore[method-assign]


def fields(row: Any) -> dict[str, Any]:
    return {f.attname: row.__dict__.get(f.attname) for f in type(row)._meta.concrete_fields}


def test_rows_are_what_the_queryset_returns(beats: None) -> None:
    since = timezone.now() - timedelta(seconds=60)
    queryset = (
        WorkerBeat.objects.filter(beat_at__gte=since, stopping=False)
        .only("name", "pid")
        .order_by("-pid")
    )
    assert [fields(r) for r in recent.rows(since)] == [fields(r) for r in queryset]
    # The fields left out stay deferred, as the queryset leaves them.
    row = recent.first(since)
    assert row is not None and row.get_deferred_fields() == {
        f.attname for f in WorkerBeat._meta.concrete_fields if f.name not in ("id", "name", "pid")
    }
    assert row._state.adding is False and row._state.db == "default"
    assert fields(by_name.get("w2")) == fields(WorkerBeat.objects.get(name="w2"))
    assert list(pids.rows("h1")) == list(
        WorkerBeat.objects.filter(host="h1").order_by("pid").values_list("pid")
    )
    assert list(names.rows("h1")) == ["w1", "w2", "w3"]
    assert list(names.rows("nowhere")) == [] and by_name.first("nobody") is None


def test_each_shape_is_compiled_once_per_connection(beats: None, compiles: list[str]) -> None:
    assert by_name.get("w1").pid == 11
    assert by_name.get("w4").pid == 14  # other values, the same statement
    assert list(names.rows("h2")) == ["w4"]
    assert list(names.rows("h1")) == ["w1", "w2", "w3"]
    assert len(compiles) == 2
    # It runs what Django compiled, with the call's values.
    with CaptureQueriesContext(connection) as queries:
        by_name.get("w3")
    assert len(queries) == 1 and "'w3'" in queries[0]["sql"]
    assert len(compiles) == 2


def test_a_list_is_one_value_whatever_its_length(beats: None, compiles: list[str]) -> None:
    """`AnyOf`: the rows `__in` returns, from one compiled statement for every length."""
    for wanted in ([], ["w2"], ["w1", "w3", "w4", "nobody"], ["w4", "w1"]):
        expected = WorkerBeat.objects.filter(name__in=wanted, stopping=False).order_by("name")
        assert [r.name for r in one_of.rows(wanted)] == [r.name for r in expected]
    assert [r.name for r in one_of.rows(["w4", "w1"])] == ["w1", "w4"]
    assert sum("ANY" in sql for sql in compiles) == 1


SQLITE_ANY_OF = """
import django
django.setup()
from django.core.management import call_command
from tests.test_compiled import beat, one_of

call_command("migrate", "diagnosis", verbosity=0)
beat("w1", 11); beat("w2", 12); beat("w3", 13, stopping=True)
print([[r.name for r in one_of.rows(wanted)] for wanted in ([], ["w2", "w3", "w1"], ["x"])])
"""


def test_a_list_is_one_value_on_sqlite_too(tmp_path: Path) -> None:
    """The embedded mode's SQLite reads the list as JSON (no arrays there)."""
    run = run_embedded(tmp_path, "-c", SQLITE_ANY_OF)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[[], ['w1', 'w2'], []]"


def test_a_placeholder_prepares_its_value_as_its_column_would(
    builtin: None, make_user: Callable[..., User]
) -> None:
    scenario = Scenario.objects.get(slug="oil_spill")
    session = Session.objects.create(
        scenario=scenario,
        scenario_version=scenario.versions.get(),
        title="compiled",
        created_by=make_user("olga", "operator"),
    )
    for pk in (session.pk, str(session.pk), session.pk.hex):
        found = session_by_pk.get(pk)
        assert found.pk == session.pk and found.title == "compiled"
        assert found.snapshot == Session.objects.get(pk=session.pk).snapshot
    assert session_by_pk.first(uuid.uuid4()) is None
    # A dict for a JSON column goes as JSON, as `update(snapshot=...)` sends it.
    snapshot = CompiledUpdate(
        Session,
        lambda: Session.objects.filter(pk=Arg(0, SESSION_PK)),
        {"snapshot": Arg(1, Session._meta.get_field("snapshot"))},
    )
    assert snapshot.run(str(session.pk), {"fields": {"position": "105"}}) == 1
    assert session_by_pk.get(session.pk).snapshot == {"fields": {"position": "105"}}


# A list inside a subquery: its column must follow the subquery's own alias (U0).
hosts_with_one_of = Compiled(
    WorkerBeat,
    lambda: (
        WorkerBeat.objects.filter(host=Arg(0))
        .annotate(
            any_named=Exists(WorkerBeat.objects.filter(AnyOf("name", 1)).exclude(stopping=True))
        )
        .order_by("name")
        .values_list("name", "any_named")
    ),
)


def test_a_list_in_a_subquery_reads_the_subquery_rows(beats: None) -> None:
    assert list(hosts_with_one_of.rows("h2", ["w1", "nobody"])) == [("w4", True)]
    assert list(hosts_with_one_of.rows("h2", ["w3"])) == [("w4", False)]  # w3 is stopping
    assert list(hosts_with_one_of.rows("h2", [])) == [("w4", False)]


def test_saving_fields_writes_those_columns_of_that_row_only(beats: None) -> None:
    row = WorkerBeat.objects.get(name="w1")
    other = WorkerBeat.objects.get(name="w2")
    row.pid, row.stopping, row.host = 99, True, "changed in memory only"
    save_fields(row, ["pid", "stopping"])
    row.pid = 100
    save_fields(row, ["pid", "stopping"])  # the same shape again, another value
    saved = WorkerBeat.objects.get(pk=row.pk)
    assert (saved.pid, saved.stopping, saved.host) == (100, True, "h1")
    assert fields(WorkerBeat.objects.get(pk=other.pk)) == fields(other)
    # As save(update_fields=...) says when the row is gone.
    WorkerBeat.objects.filter(pk=row.pk).delete()
    with pytest.raises(DatabaseError, match="did not affect any rows"):
        save_fields(row, ["pid"])


def test_saving_fields_of_a_model_with_save_receivers_runs_them(beats: None) -> None:
    seen: list[int] = []

    def receiver(sender: Any, instance: WorkerBeat, **kwargs: Any) -> None:
        seen.append(instance.pid)

    pre_save.connect(receiver, sender=WorkerBeat, dispatch_uid="test-save-fields")
    try:
        row = WorkerBeat.objects.get(name="w1")
        row.pid = 42
        save_fields(row, ["pid"])
    finally:
        pre_save.disconnect(sender=WorkerBeat, dispatch_uid="test-save-fields")
    assert seen == [42] and WorkerBeat.objects.get(name="w1").pid == 42


def test_get_raises_as_the_queryset_does(beats: None) -> None:
    with pytest.raises(WorkerBeat.DoesNotExist):
        by_name.get("nobody")
    with pytest.raises(WorkerBeat.MultipleObjectsReturned):
        Compiled(WorkerBeat, lambda: WorkerBeat.objects.filter(host=Arg(0))).get("h1")


def test_an_update_sets_its_values_and_counts_its_rows(beats: None) -> None:
    when = timezone.now() + timedelta(days=1)
    assert stop.run("h1", when) == 3
    assert stop.run("nowhere", when) == 0
    rows = WorkerBeat.objects.order_by("name").values_list("name", "stopping", "beat_at")
    assert [(n, s, b == when) for n, s, b in rows] == [
        ("w1", True, True),
        ("w2", True, True),
        ("w3", True, True),
        ("w4", False, False),
    ]


def test_a_failed_update_marks_its_transaction_for_rollback(beats: None) -> None:
    """As QuerySet.update() does: code that catches the error cannot commit the rest."""
    too_long = CompiledUpdate(
        WorkerBeat, lambda: WorkerBeat.objects.filter(name=Arg(0)), {"host": Arg(1)}
    )
    with transaction.atomic():
        with contextlib.suppress(DatabaseError):
            too_long.run("w1", "x" * 500)
        assert transaction.get_connection().needs_rollback


@pytest.mark.parametrize(
    "build",
    [
        lambda: Session.objects.select_related("scenario").filter(pk=Arg(0)),
        lambda: Session.objects.prefetch_related("events").filter(pk=Arg(0)),
        lambda: WorkerBeat.objects.values("name").filter(name=Arg(0)),
        lambda: WorkerBeat.objects.extra(select={"one": "1"}).filter(name=Arg(0)),
    ],
    ids=["select_related", "prefetch", "dicts", "extra"],
)
def test_shapes_it_cannot_run_the_same_way_are_refused(build: Callable[[], Any]) -> None:
    with pytest.raises(ValueError, match="compiled statement"):
        list(Compiled(WorkerBeat, build).rows("w1"))


def test_a_statement_made_after_another_was_dropped_runs_its_own_sql(beats: None) -> None:
    """A dropped statement's memory (and id) goes to the next one made: its plan must
    not be the one that runs (CI ran the previous parametrised test's SQL once)."""

    def of_host(host: str) -> Callable[[], Any]:
        return lambda: (
            WorkerBeat.objects.filter(host=host).order_by("name").values_list("name", flat=True)
        )

    cases = [(of_host("h2"), ["w4"]), (of_host("h1"), ["w1", "w2", "w3"])]
    for i in range(20):
        build, expected = cases[i % 2]
        statement = Compiled(WorkerBeat, build)
        assert list(statement.rows()) == expected
        del statement


def test_model_rows_cannot_be_annotated() -> None:
    from django.db.models import Value

    annotated = Compiled(
        WorkerBeat, lambda: WorkerBeat.objects.annotate(one=Value(1)).filter(name=Arg(0))
    )
    with pytest.raises(ValueError, match="annotate"):
        annotated.first("w1")


def test_rows_inserted_from_one_parameter_come_back_as_written() -> None:
    """Several rows go as one jsonb parameter: the same SQL for any number of
    rows, and each value (text, number, boolean, time, UUID, null) read back as
    written."""
    now = timezone.now()
    session = uuid.uuid4()
    rows = [
        WorkerBeat(
            name=f'w-{i} ünïcode "quoted"',
            host="h9",
            pid=i,
            started_at=now - timedelta(microseconds=i),
            beat_at=now,
            session_id=session if i % 2 else None,
            stopping=bool(i % 2),
        )
        for i in range(1, 6)
    ]
    conn = connections["default"]
    if conn.vendor != "postgresql":
        pytest.skip("several rows from one jsonb parameter: PostgreSQL")
    sql = insert_sql(conn, WorkerBeat, 5, returning=True)
    assert sql == insert_sql(conn, WorkerBeat, 2, returning=True)
    with conn.cursor() as cursor:
        cursor.execute(sql, insert_values(WorkerBeat, rows, conn))
        ids = [row[0] for row in cursor.fetchall()]
    assert len(ids) == 5
    stored = {b.name: b for b in WorkerBeat.objects.filter(host="h9")}
    for row in rows:
        back = stored[row.name]
        assert (back.pid, back.started_at, back.beat_at, back.session_id, back.stopping) == (
            row.pid,
            row.started_at,
            row.beat_at,
            row.session_id,
            row.stopping,
        )
    # One row: Django's own VALUES, its values as they are.
    one = WorkerBeat(name="single", host="h9", pid=7, started_at=now, beat_at=now)
    with conn.cursor() as cursor:
        cursor.execute(
            insert_sql(conn, WorkerBeat, 1, returning=False), insert_values(WorkerBeat, [one], conn)
        )
    assert WorkerBeat.objects.get(name="single").pid == 7


def test_inserted_rows_get_their_own_pks() -> None:
    """insert_rows is bulk_create's result: each new row its pk, in order, saved."""
    now = timezone.now()
    for count in (1, 3, 4):
        beats = [
            WorkerBeat(
                name=f"r{count}-{i}", host="h7", pid=100 * count + i, started_at=now, beat_at=now
            )
            for i in range(count)
        ]
        assert insert_rows(WorkerBeat, beats) is beats
        for beat_row in beats:
            assert beat_row._state.adding is False
            assert WorkerBeat.objects.get(pk=beat_row.pk).name == beat_row.name
    assert insert_rows(WorkerBeat, []) == []
    assert WorkerBeat.objects.filter(host="h7").count() == 8
