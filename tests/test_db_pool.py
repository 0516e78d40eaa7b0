"""PostgreSQL connections through psycopg's pool (docs/operations.md): a process holds at
most AERO_DB_POOL_SIZE backends whatever the number of clients. daphne serving 50 HTTP
clients at once had held 50-57 (one per request thread) and a shared server answered
"too many clients"; through the pool the 50 all get their page from 3 connections.

Counted in pg_stat_activity for the test database, by the server's application_name."""

from __future__ import annotations

import subprocess
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection

from tests import conftest
from tests.servers import PYTHON, ROOT, daphne, service_env
from tests.test_live_timeline import cookie_for
from tests.test_ws_connections import Sampler, connections_of, wait_for
from tests.web_helpers import STAND_FUEL_LEAK, make_session

pytestmark = pytest.mark.services

POOL = 3
CLIENTS = 50


def backends_of_test_db() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        (count,) = cursor.fetchone()
    return int(count)


@pytest.fixture
def pooled_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(base URL, application_name) of a daphne whose pool holds POOL connections."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    name = f"aero-test-pool-{uuid.uuid4().hex[:8]}"
    env = {
        **conftest.ASGI_ENV,
        "AERO_JOB_BACKEND": "rq",
        "AERO_LLM_WAITS": "0",
        "AERO_DB_APPLICATION_NAME": name,
        "AERO_DB_POOL_SIZE": str(POOL),
        # 50 requests on 3 connections: the last waits for 16 turns of a page.
        "AERO_DB_POOL_TIMEOUT": "60",
        "AERO_DB_POOL_MAX_IDLE": "0.5",
    }
    with daphne(conftest.test_db_url(), str(settings.REDIS_URL), tmp_path / "d.log", **env) as base:
        yield base, name
    # Only this server's connections (by their application_name): ending every other
    # backend of the test database also ended the shared test server's pooled ones.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [name],
        )


def test_50_concurrent_requests_hold_at_most_the_pools_connections(
    builtin: None, make_user: Callable[..., User], pooled_server: tuple[str, str]
) -> None:
    base, name = pooled_server
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    make_session(olga, STAND_FUEL_LEAK)  # the queue page has approvals to read
    cookie = cookie_for(abel)
    wait_for(lambda: connections_of(name) == 0, "the server's start-up connections to close")
    before = backends_of_test_db()
    most_on_db = 0
    stop = threading.Event()

    def count_db() -> None:
        nonlocal most_on_db
        from django.db import connections

        try:
            while not stop.is_set():
                most_on_db = max(most_on_db, backends_of_test_db())
                stop.wait(0.02)
        finally:
            connections.close_all()

    def fetch(_: int) -> tuple[int, str]:
        request = urllib.request.Request(f"{base}/approvals/", headers={"Cookie": cookie})
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read().decode()

    counter = threading.Thread(target=count_db, daemon=True)
    with Sampler(name) as sampler:
        counter.start()
        with ThreadPoolExecutor(CLIENTS) as clients:
            answers = list(clients.map(fetch, range(CLIENTS)))
        stop.set()
        counter.join(timeout=10)

    # Every client got the queue, with its approvals.
    assert [status for status, _ in answers] == [200] * CLIENTS
    assert all('class="queue-item"' in html for _, html in answers)
    assert sampler.samples > 0
    # Never more backends than the pool holds: the server's by name, and the test
    # database's in all (the test's own connections, and the two counting threads').
    assert 0 < sampler.most <= POOL, sampler.most
    assert most_on_db <= before + POOL + 2, (before, most_on_db)
    # Unused, they are closed again (one per AERO_DB_POOL_MAX_IDLE).
    wait_for(lambda: connections_of(name) == 0, "the pool's idle connections to close")


def test_servers_and_workers_run_through_the_pool_unless_turned_off() -> None:
    """Production's settings (what the suite's servers and workers load): the pool on with
    PostgreSQL, 8 connections for a worker, daphne's database threads + 1;
    AERO_DB_POOL=0 is the way back to one kept connection per thread."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    show = (
        "from django.conf import settings as s; d = s.DATABASES['default'];"
        "print(d['CONN_MAX_AGE'], d['OPTIONS'].get('pool', {}).get('max_size'))"
    )

    def settings_of(**extra: str) -> str:
        env = service_env(conftest.test_db_url(), str(settings.REDIS_URL), **extra)
        result = subprocess.run(
            [PYTHON, "-c", f"import django; django.setup(); {show}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip()

    assert settings_of() == "0 8"
    assert settings_of(AERO_ASGI_PROCESS="1", AERO_ASGI_DB_THREADS="3") == "0 4"
    assert settings_of(AERO_DB_POOL_SIZE="2") == "0 2"
    assert settings_of(AERO_DB_POOL="0") == "300 None"
