"""Database connections of daphne (docs/operations.md): its consumers' database calls run
on AERO_ASGI_DB_THREADS threads, each on a connection closed after the call, so 100 open
page sockets hold no idle connection and a burst never opens more than the pool's
threads; 50 clients reconnecting at once all get their socket and their first render.

Counted in pg_stat_activity by the application_name this daphne's connections carry."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from websockets.asyncio.client import ClientConnection, connect

from tests import conftest
from tests.servers import daphne
from tests.test_live_timeline import cookie_for

pytestmark = pytest.mark.services

THREADS = 3
VIEWERS = 100
CHURN = 50


def connections_of(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
        (count,) = cursor.fetchone()
    return int(count)


class Sampler:
    """Counts the server's connections over and over from a thread of its own while the
    sockets open: the most it saw."""

    def __init__(self, name: str) -> None:
        self.name, self.most, self.samples = name, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from django.db import connections

        try:
            while not self.stop.is_set():
                self.most = max(self.most, connections_of(self.name))
                self.samples += 1
                self.stop.wait(0.02)
        finally:
            connections.close_all()

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(base URL, application_name) of a daphne of this test's own."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    name = f"aero-test-daphne-{uuid.uuid4().hex[:8]}"
    env = {
        **conftest.ASGI_ENV,
        # As production's daphne: jobs run in workers, none in this process.
        "AERO_JOB_BACKEND": "rq",
        "AERO_LLM_WAITS": "0",
        "AERO_DB_APPLICATION_NAME": name,
        "AERO_ASGI_DB_THREADS": str(THREADS),
    }
    log = tmp_path / "daphne.log"
    with daphne(conftest.test_db_url(), str(settings.REDIS_URL), log, **env) as base:
        yield base, name
    conftest.close_other_connections()  # the server's, if any outlived it


async def open_board(base: str, cookie: str) -> ClientConnection:
    """A board socket that got its first render (each connect renders the board)."""
    socket = await connect(
        base.replace("http://", "ws://") + "/ws/airport/?lang=en",
        additional_headers={"Cookie": cookie, "Origin": base},
        open_timeout=60,
        max_queue=None,
    )
    first = await asyncio.wait_for(socket.recv(), timeout=60)
    assert 'id="airport-board"' in str(first)
    return socket


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    import time

    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_daphne_holds_no_idle_connection_with_100_sockets_open_and_50_reconnect_at_once(
    builtin: None, make_user: Callable[..., User], server: tuple[str, str]
) -> None:
    base, name = server
    users = [make_user(f"viewer{n}", "operator") for n in range(10)]
    cookies = [cookie_for(user) for user in users]
    wait_for(lambda: connections_of(name) == 0, "the server's start-up connections to close")

    async def run() -> tuple[int, list[bool]]:
        sockets = await asyncio.gather(
            *(open_board(base, cookies[n % len(cookies)]) for n in range(VIEWERS))
        )
        await asyncio.to_thread(
            wait_for, lambda: connections_of(name) == 0, "no idle connection with 100 open"
        )
        open_now = sum(1 for s in sockets if s.state.name == "OPEN")
        # Churn: half the viewers drop and come back at once.
        await asyncio.gather(*(s.close() for s in sockets[:CHURN]))
        results = await asyncio.gather(
            *(open_board(base, cookies[n % len(cookies)]) for n in range(CHURN)),
            return_exceptions=True,
        )
        back = [not isinstance(r, BaseException) for r in results]
        await asyncio.gather(
            *(
                s.close()
                for s in [
                    *sockets[CHURN:],
                    *(r for r in results if not isinstance(r, BaseException)),
                ]
            )
        )
        return open_now, back

    with Sampler(name) as sampler:
        open_now, back = asyncio.run(run())
    assert open_now == VIEWERS
    assert back == [True] * CHURN
    assert sampler.samples > 0
    # Never more connections than the pool has threads (and the web ticker's one, while
    # it ticks), bursts included.
    assert 0 < sampler.most <= THREADS + 1, sampler.most
    wait_for(lambda: connections_of(name) == 0, "no idle connection after the churn")
