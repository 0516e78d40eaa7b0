from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.management.commands import flush as flush_command
from django.core.management.sql import emit_post_migrate_signal
from django.db import OperationalError, connection, connections
from django.db.backends.postgresql.operations import DatabaseOperations as PostgresOperations
from django.utils import translation
from playwright.sync_api import Browser, expect, sync_playwright

from aero.models import AuditLog
from aero.roles import ALL_ROLES, ensure_role_groups
from diagnosis.models import Session
from scenarios_admin.builtin import load_builtin_data
from tests import browser_helpers, static_scan, xdist_groups
from tests.web_helpers import STAND_FUEL_LEAK, waiting_session


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "long: a minute or more of one worker (subprocesses, servers, whole runs): started "
        "first when it leaves the test database alone",
    )


def _uses_test_database(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return item.get_closest_marker("django_db") is not None or bool(
        {"db", "transactional_db", "live_server"} & set(names)
    )


@pytest.hookimpl(trylast=True)  # after xdist's own naming of the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xdist_groups.name_groups(config, items)
    # The long tests that leave the test database alone first (a stable sort: everything
    # else keeps pytest-django's order, database tests before transactional ones before
    # the rest). xdist hands tests out in this order: last in it, the long subprocess
    # tests kept one worker busy for minutes after the other had run out of work.
    items.sort(
        key=lambda item: not (item.get_closest_marker("long") and not _uses_test_database(item))
    )
    from tests.settings import REQUIRE_SERVICES, SERVICES_UP

    if SERVICES_UP or REQUIRE_SERVICES:
        return
    skip = pytest.mark.skip(
        reason="PostgreSQL/Redis not reachable (set AERO_REQUIRE_SERVICES=1 to fail)"
    )
    for item in items:
        if "services" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run's Redis keys and bundle copies go at its end (tests/redis_cleanup.py):
    queues, jobs, workers, rate counters and replay cache entries would otherwise stay,
    some without expiry.
    Each xdist worker removes its own; Redis down (the SQLite fallback) leaves nothing."""
    import redis

    from tests.redis_cleanup import remove_run_keys
    from tests.settings import TEST_DB_NAME

    # Sessions' bundle copies too: left in var/test they were a second copy of the
    # examples' Python files, and `mypy .` stopped on the duplicate module names.
    shutil.rmtree(settings.AERO_BUNDLE_DIR, ignore_errors=True)
    if not settings.REDIS_URL:
        return
    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2)
    try:
        remove_run_keys(client, TEST_DB_NAME)
    except redis.RedisError:
        pass
    finally:
        client.close()


@pytest.fixture(scope="session", autouse=True)
def _static_files_scanned_once() -> Iterator[None]:
    """Each test client's WhiteNoise middleware reuses the process's scan of the static
    finders (tests/static_scan.py)."""
    with static_scan.kept():
        yield


@pytest.fixture(autouse=True)
def _no_definitions_of_other_tests() -> None:
    """Scenario versions are immutable, so processes cache their definitions by primary
    key; a test database's rows are not, and an id can come back with another
    definition after a flush."""
    from diagnosis import presenters
    from diagnosis.jobs import world

    world._definitions.clear()
    presenters._definitions.clear()


@pytest.fixture(autouse=True)
def _no_queue_pages_of_other_tests() -> None:
    """The approval queue's pages are kept under a stamp that moves with every change
    (approvals.page_cache); a test database's flush is none: a page of the last test
    could otherwise answer the next one's first request."""
    from aero import stamps
    from approvals import page_cache

    page_cache._local.clear()
    stamps.touch_now(stamps.QUEUE)


@pytest.fixture(autouse=True)
def _language_of_the_settings() -> Iterator[None]:
    """Each test starts in the settings' language. A request switches the thread's
    language (LocaleMiddleware) and nothing switched it back: after a test that asked for
    a page in zh-hans, the next test's own calls (an ActionError's message) spoke
    Chinese, and tests/test_event_log.py failed when it ran after tests/test_i18n.py."""
    yield
    translation.deactivate()


@pytest.fixture(scope="session")
def django_db_modify_db_settings_xdist_suffix() -> None:
    """pytest-django would suffix the test database with the xdist worker's id; the
    name in tests/settings.py has it already (queues and scratch databases derive from
    the same name)."""


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: Any, django_db_blocker: Any) -> Iterator[None]:
    # The test flush TRUNCATEs every table; the audit log refuses TRUNCATE for everyone.
    # This disposable database's owner (the suite connects as it, as migrations do in
    # production) switches that one trigger off here. The app's role could not: it does
    # not own the table (tests/test_audit_integrity.py checks as that role).
    with django_db_blocker.unblock():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ALTER TABLE aero_auditlog DISABLE TRIGGER aero_audit_no_truncate")
    with pytest.MonkeyPatch.context() as patch:
        if connection.vendor == "postgresql":
            patch.setattr(type(connection.ops), "sql_flush", _delete_flush)
            patch.setattr(type(connection.ops), "execute_sql_flush", _flush_past_deadlocks)
            patch.setattr(flush_command, "emit_post_migrate_signal", _post_migrate_rows_back)
        yield
    from diagnosis.jobs import close_agent_runtime

    close_agent_runtime()  # its own connection to the test database, which is dropped next


# Rows a DELETE may not remove (the append-only trigger is enabled ALWAYS): truncated, as
# the fixture above allows.
APPEND_ONLY_TABLES = {"aero_auditlog"}
_truncate_flush = PostgresOperations.sql_flush
_execute_flush = PostgresOperations.execute_sql_flush


def _post_migrate_rows_back(verbosity: int, interactive: bool, database: str) -> None:
    """After a test's flush, the rows post_migrate writes (content types, permissions)
    copied back in, as the first flush's post_migrate wrote them: the signal re-ran ~100
    queries (a SELECT per app and model set) after every transactional test, 0.2-0.5 s of
    each on a loaded machine; the copy is two COPY statements. Its only receivers are
    Django's, and they write the same rows for the same models, ids aside."""
    if not _POST_MIGRATE_ROWS:
        emit_post_migrate_signal(verbosity, interactive, database)
        # Everything else was just emptied: what holds rows now is post_migrate's.
        _POST_MIGRATE_ROWS.extend(_copy_out())
        return
    from django.contrib.contenttypes.models import ContentType
    from django.db import transaction

    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        for name, data in _POST_MIGRATE_ROWS:
            with cursor.copy(f"COPY {name} FROM STDIN") as copy:
                copy.write(data)
    ContentType.objects.clear_cache()  # as post_migrate's create_contenttypes does


# Per worker process: the rows the first flush's post_migrate wrote, by table.
_POST_MIGRATE_ROWS: list[tuple[str, bytes]] = []


def _flush_past_deadlocks(ops: PostgresOperations, sql_list: list[str]) -> None:
    """The flush, again when PostgreSQL picked it as a deadlock's victim: a test server's
    transaction (a job's step, a stream's pull) can hold one table the flush's LOCK wants
    while it waits for another the flush holds (CI: a teardown's flush failed, and the
    next test's copy-in met the rows it left). The flush's transaction rolled back whole,
    and the server's went on, so a second attempt finds the tables free."""
    from psycopg import errors

    # One round trip for the LOCK and the ~60 DELETEs (no parameters: one query string).
    joined = [";\n".join(sql_list)] if sql_list else []
    for attempt in range(5):
        try:
            return _execute_flush(ops, joined)
        except OperationalError as error:
            if not isinstance(error.__cause__, errors.DeadlockDetected) or attempt == 4:
                raise
    return None


def _delete_flush(
    ops: PostgresOperations,
    style: Any,
    tables: list[str],
    *,
    reset_sequences: bool = False,
    allow_cascade: bool = False,
) -> list[str]:
    """The flush after every transactional test, as DELETEs: one TRUNCATE of the ~50
    tables made a file per table and index and took 0.6-1.4 s on a loaded machine (most
    of a short test); the DELETEs of their few rows take ~0.04 s. The same
    locks first, as TRUNCATE took them: it waits for a server's open transactions and
    sees their rows, so nothing committed by another process before the flush survives
    it. The deferred foreign keys let the tables empty in any order."""
    if reset_sequences or allow_cascade or not tables:
        return _truncate_flush(
            ops, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )
    quoted = {table: ops.quote_name(table) for table in tables}
    return [
        f"LOCK TABLE {', '.join(quoted.values())} IN ACCESS EXCLUSIVE MODE",
        *(
            f"TRUNCATE {name}" if table in APPEND_ONLY_TABLES else f"DELETE FROM {name}"
            for table, name in quoted.items()
        ),
    ]


@pytest.fixture
def builtin(transactional_db: None) -> None:
    """The built-in airport and scenarios, committed (jobs and other processes see them).

    Loaded for real once per worker process, then copied back in: ~600 tests take it, and
    the load (each scenario's publication runs its example cases through the agent's
    extraction and rules) would be most of each one's setup. The rows are those the load
    wrote, ids and audit chain included; the flush after a test does not reset sequences,
    so the ids a test creates never meet them."""
    if connection.vendor != "postgresql":
        load_builtin_data()
        ensure_role_groups()
        return
    if not _BUILTIN_ROWS:
        # What a flush leaves (content types, permissions: re-created after it) is not
        # the load's: only the tables empty before it are copied.
        before = {name for name, _ in _copy_out()}
        audited = AuditLog.objects.order_by("-id").values_list("id", flat=True).first() or 0
        load_builtin_data()
        ensure_role_groups()
        _BUILTIN_ROWS.extend((name, rows) for name, rows in _copy_out() if name not in before)
        # The load's audit entries are appended again, chained to whatever the test's
        # other fixtures wrote before (a copy would break the chain's link).
        _BUILTIN_AUDIT.extend(
            dict(entry)
            for entry in AuditLog.objects.filter(id__gt=audited)
            .order_by("id")
            .values(
                "actor_id",
                "actor_label",
                "action",
                "object_type",
                "object_id",
                "session_id",
                "detail",
            )
        )
        return
    _copy_in(_BUILTIN_ROWS)


@pytest.fixture
def builtin_loaded(transactional_db: None) -> None:
    """`builtin` by the real load, every time: for the query budgets pinned with the
    per-process caches as the load (its publications) leaves them; a copied-in load
    reads 4 statements more in a session's first job (tests/test_event_batch.py)."""
    load_builtin_data()
    ensure_role_groups()


# Per worker process: (table, its rows in COPY's text format), in no particular order
# (the foreign keys are deferred to the commit), and the audit entries the load wrote.
_BUILTIN_ROWS: list[tuple[str, bytes]] = []
_BUILTIN_AUDIT: list[dict[str, Any]] = []
AUDIT_TABLE = '"aero_auditlog"'
GROUP_TABLE = '"auth_group"'


def _copy_out() -> list[tuple[str, bytes]]:
    tables = connection.introspection.django_table_names(include_views=False)
    rows: list[tuple[str, bytes]] = []
    with connection.cursor() as cursor:
        for table in sorted(tables):
            name = connection.ops.quote_name(table)
            data = bytearray()
            with cursor.copy(f"COPY {name} TO STDOUT") as copy:
                for block in copy:
                    data += block
            if data:
                rows.append((name, bytes(data)))
    return rows


def _copy_in(rows: list[tuple[str, bytes]]) -> None:
    from django.db import transaction

    from packs.airport.world import forget_cached_graph

    with transaction.atomic():
        with connection.cursor() as cursor:
            for name, data in rows:
                if name not in (AUDIT_TABLE, GROUP_TABLE):
                    with cursor.copy(f"COPY {name} FROM STDIN") as copy:
                        copy.write(data)
        for entry in _BUILTIN_AUDIT:
            AuditLog(**entry).save()
        ensure_role_groups()  # the personas' fixtures may have made them already
    forget_cached_graph()


@pytest.fixture
def make_user(db: None) -> Callable[..., User]:
    def make(username: str, *roles: str, password: str = "pw-for-tests") -> User:
        assert all(role in ALL_ROLES for role in roles)
        ensure_role_groups()
        user = User.objects.create_user(username=username, password=password)
        user.groups.add(*Group.objects.filter(name__in=roles))
        return user

    return make


# Personas for the view tests: alice operates, bob approves, carol audits, dave has no role.
@pytest.fixture
def alice(make_user: Callable[..., User]) -> User:
    return make_user("alice", "operator")


@pytest.fixture
def bob(make_user: Callable[..., User]) -> User:
    return make_user("bob", "approver")


@pytest.fixture
def carol(make_user: Callable[..., User]) -> User:
    return make_user("carol", "auditor")


@pytest.fixture
def dave(make_user: Callable[..., User]) -> User:
    return make_user("dave")


# The queue and cockpit tests' personas: olga operates, abel approves; olga's waiting
# session of stand 105 (R1 crew and fire standby, R2 stand suspension, two taxiway closures).
@pytest.fixture
def olga(make_user: Callable[..., User]) -> User:
    return make_user("olga", "operator")


@pytest.fixture
def abel(make_user: Callable[..., User]) -> User:
    return make_user("abel", "approver")


@pytest.fixture
def stand_leak(builtin: None, olga: User) -> Session:
    return waiting_session(olga, STAND_FUEL_LEAK)


@pytest.fixture
def db_url() -> str:
    """A DATABASE_URL for subprocesses that points at the test database."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    return test_db_url()


@pytest.fixture
def redis_url() -> str:
    return str(settings.REDIS_URL)


def test_db_url() -> str:
    params = connection.settings_dict
    return (
        f"postgres://{params['USER'] or 'postgres'}@{params['HOST'] or '127.0.0.1'}:"
        f"{params['PORT'] or 5432}/{params['NAME']}"
    )


@pytest.fixture(scope="session")
def asgi_server(
    django_db_setup: None, django_db_blocker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """daphne serving AERO (HTTP + WebSocket) in a subprocess, on the test database, with
    channels_redis and the embedded job worker inside it. Without the embedded LLM
    runner: this server lives for the whole run, and its runner thread beat into the
    test database's WorkerBeat table long after the test that needed it (the heartbeat
    tests counted it); the streaming test starts a server of its own with one
    (`asgi_server_with_llm_runner`)."""
    from tests.servers import daphne

    if connection.vendor != "postgresql":
        pytest.skip("the ASGI server tests need PostgreSQL")
    log = tmp_path_factory.mktemp("daphne") / "daphne.log"
    env = {**ASGI_ENV, "AERO_LLM_WAITS": "0"}
    with daphne(test_db_url(), str(settings.REDIS_URL), log, **env) as base:
        yield base
    # The server's connections may outlive it by a moment; the test database must be
    # droppable at the end of the run.
    with django_db_blocker.unblock():
        close_other_connections()


# The test daphne's settings. Its reconciler stays quiet during the run: a tick that
# reads tables while a transactional test's flush TRUNCATEs them can deadlock the flush.
ASGI_ENV = {
    "AERO_JOB_BACKEND": "embedded",
    "AERO_RECONCILE_SECONDS": "3600",
    # Short, so a test sees a page catch up on an event whose notice was lost.
    "AERO_LIVE_RESYNC_SECONDS": "1",
}


def close_other_connections() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def asgi_server_with_llm_runner(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """asgi_server, with the embedded LLM runner (model calls are waits), for one
    test: stopped at its end, so no runner thread outlives the test that needs it."""
    from tests.servers import daphne

    if connection.vendor != "postgresql":
        pytest.skip("the ASGI server tests need PostgreSQL")
    log = tmp_path_factory.mktemp("daphne") / "daphne.log"
    with daphne(test_db_url(), str(settings.REDIS_URL), log, **ASGI_ENV) as base:
        yield base


@pytest.fixture
def clean_queue() -> Iterator[None]:
    import django_rq

    queues = [
        django_rq.get_queue(name) for name in (settings.AERO_QUEUE, settings.AERO_PRIORITY_QUEUE)
    ]
    for queue in queues:
        queue.empty()  # this run's queues only: other runs may share the Redis database
    yield
    for queue in queues:
        queue.empty()


@pytest.fixture
def browser() -> Iterator[Browser]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.fail("Debian chromium is not installed (scripts/install-browser.sh)")
    # Assertions wait for pushed updates; a loaded CI machine needs more than 5 s. This is a
    # limit on waiting, not a speed check (benchmarks measure speed).
    expect.set_options(timeout=15_000)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=browser_helpers.CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def whole_timeline_on_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session page shows every event (up to a timeline page), as tests that read a
    session's earlier lines on its page expect; by default it shows the newest
    SESSION_PAGE_EVENTS, older ones a click away."""
    from diagnosis import presenters

    monkeypatch.setattr(presenters, "SESSION_PAGE_EVENTS", presenters.TIMELINE_PAGE)
