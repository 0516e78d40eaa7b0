"""Several daphne processes serving one session's viewers (the production layout runs
AERO_WS_PROCESSES of them on one port): each viewer, on either process, gets every event
once and in order while events are written as fast as they can be; and a fragment is
rendered once per event for every viewer of both processes (the other process fetches
it, diagnosis/live_shared.py), whatever the number of viewers; its frames are written to
daphne's sockets directly (diagnosis/live_write.py)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from websockets.asyncio.client import connect

from diagnosis import live_shared
from diagnosis.events import append_event
from diagnosis.live_render import Pull, render_batch
from tests import conftest
from tests.servers import daphne
from tests.test_live_timeline import SEQ, cookie_for, new_session, ws_url

pytestmark = pytest.mark.services

VIEWERS_PER_PROCESS = 8


def reached(seqs: list[list[int]], seq: int) -> bool:
    return all(received and received[-1] >= seq for received in seqs)


def renders(metrics_dir: Path) -> dict[str, float]:
    """aero_live_renders summed over every process that wrote to `metrics_dir`."""
    return counted(metrics_dir, "aero_live_renders_total", "source", ("rendered", "shared"))


def sharing_fallbacks(*logs: Path) -> list[str]:
    """The servers' log lines where a shared render fell back to rendering again."""
    return [
        line
        for log in logs
        for line in log.read_text(errors="replace").splitlines()
        if "shared live renders:" in line
    ]


def frames(metrics_dir: Path) -> dict[str, float]:
    """aero_live_frames (written to the socket directly, or through the ASGI send)."""
    return counted(metrics_dir, "aero_live_frames_total", "path", ("direct", "buffered", "asgi"))


def counted(metrics_dir: Path, name: str, label: str, values: tuple[str, ...]) -> dict[str, float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    found = dict.fromkeys(values, 0.0)
    for family in registry.collect():
        for sample in family.samples:
            if sample.name == name:
                found[sample.labels[label]] += sample.value
    return found


class Viewers:
    """Page sockets on several servers, read in a thread of their own: each one's seqs in
    the order received."""

    def __init__(self, urls: list[str], headers: list[dict[str, str]]) -> None:
        self.seqs: list[list[int]] = [[] for _ in urls]
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(urls, headers), daemon=True)
        self.thread.start()
        assert self.ready.wait(60), "the viewers did not connect"
        if self.error is not None:
            raise self.error

    def _run(self, urls: list[str], headers: list[dict[str, str]]) -> None:
        async def main() -> None:
            sockets = [
                await connect(url, additional_headers=header, open_timeout=30, max_queue=None)
                for url, header in zip(urls, headers, strict=True)
            ]
            self.ready.set()

            async def read(n: int) -> None:
                with contextlib.suppress(Exception):
                    async for message in sockets[n]:
                        self.seqs[n] += [int(seq) for seq in SEQ.findall(str(message))]

            readers = [asyncio.ensure_future(read(n)) for n in range(len(sockets))]
            while not self.stop.is_set():
                await asyncio.sleep(0.05)
            for socket in sockets:
                await socket.close()
            await asyncio.gather(*readers)

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc
            self.ready.set()

    def wait_for(self, done: Callable[[list[list[int]]], bool], timeout: float) -> None:
        deadline = threading.Event()
        timer = threading.Timer(timeout, deadline.set)
        timer.start()
        try:
            while not done(self.seqs) and not deadline.is_set():
                deadline.wait(0.05)
        finally:
            timer.cancel()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


def test_two_daphne_processes_deliver_every_event_once_and_render_it_once(
    builtin: None, make_user: Callable[..., User], tmp_path: Path
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the ASGI server tests need PostgreSQL")
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {
        **conftest.ASGI_ENV,
        "AERO_LLM_WAITS": "0",
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        # Long enough that a loaded machine never makes the second process give up
        # waiting and render again (production waits 0.25 s).
        "AERO_LIVE_SHARE_WAIT_SECONDS": "10",
    }
    operator = make_user("olga", "operator")
    session = new_session(operator, "105机位燃油泄漏")
    start = session.last_seq
    with contextlib.ExitStack() as stack:
        bases = [
            stack.enter_context(
                daphne(
                    conftest.test_db_url(),
                    str(settings.REDIS_URL),
                    tmp_path / f"daphne{n}.log",
                    **env,
                )
            )
            for n in (1, 2)
        ]
        urls = [ws_url(base, session, start) for base in bases for _ in range(VIEWERS_PER_PROCESS)]
        headers = [
            {"Cookie": cookie_for(operator), "Origin": base}
            for base in bases
            for _ in range(VIEWERS_PER_PROCESS)
        ]
        viewers = Viewers(urls, headers)
        stack.callback(viewers.close)
        before = renders(metrics_dir)

        # One event at a time: each is rendered once for the 16 viewers of both processes.
        paced = 5
        for n in range(paced):
            event = append_event(session.pk, "agent.note", {"text": f"one {n}"}, producer="t")
            viewers.wait_for(functools.partial(reached, seq=event.seq), 30)
        paced_end = start + paced
        assert all(v == list(range(start + 1, paced_end + 1)) for v in viewers.seqs)
        counted = renders(metrics_dir)
        # A second render is only ever sharing's fallback (Redis slow or a claimer late,
        # which a loaded machine can cause), and then the log says so.
        fallbacks = sharing_fallbacks(tmp_path / "daphne1.log", tmp_path / "daphne2.log")
        assert paced <= counted["rendered"] - before["rendered"] <= paced + len(fallbacks), (
            fallbacks
        )
        # the other process fetched each render (a fetch may repeat: never a render)
        assert counted["shared"] - before["shared"] >= paced - len(fallbacks)

        # Then as fast as they can be written: every viewer gets each once, in order.
        burst = 40
        for n in range(burst):
            last = append_event(session.pk, "agent.note", {"text": f"fast {n}"}, producer="t")
        viewers.wait_for(functools.partial(reached, seq=last.seq), 60)
        for seqs in viewers.seqs:
            assert seqs == list(range(start + 1, last.seq + 1))
        # Under daphne every frame was framed once per fan-out and written to the sockets
        # directly (diagnosis/live_write.py), none through the ASGI send; at least one
        # frame per viewer and paced event (a burst's frames may be batched together),
        # sent at once to the idle sockets (a socket with data waiting: to its buffer).
        written = frames(metrics_dir)
        assert written["asgi"] == 0
        assert written["direct"] + written["buffered"] >= len(urls) * paced
        assert written["direct"] >= len(urls) * paced / 2


def test_a_process_stores_its_own_renders_before_waiting_for_another_s(
    builtin: None, make_user: Callable[..., User], settings: Any
) -> None:
    """A burst over two sessions, the second's render claimed by another process: this
    one renders and stores the first before it waits for the second (the other process
    may be waiting for the first: each waiting for the other first held both for the whole
    wait, then both rendered everything), and sends what the other stored for the second."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL and Redis")
    settings.AERO_LIVE_SHARE_WAIT_SECONDS = 60  # only the other's store ends the wait
    operator = make_user("olga", "operator")
    first, second = (new_session(operator, text) for text in ("105机位燃油泄漏", "106机位漏油"))
    roles = frozenset({"operator"})
    pulls = [Pull(roles, str(s.pk), s.last_seq - 1, None, "en") for s in (first, second)]
    mine, theirs = (
        live_shared.key_of(p.session_id, p.after, s.last_seq, roles, None, "en")
        for p, s in zip(pulls, (first, second), strict=True)
    )
    assert live_shared.claim([theirs]) == ({}, [])  # the other process renders the second
    seen_mine: list[bool] = []
    stored_by_them: list[dict[str, Any]] = []

    def other_process() -> None:
        # It waits for this process's render of the first session, then stores its own
        # of the second (here: the same content, so the test can tell it was fetched).
        found = live_shared.wait_for([mine])  # within 60 s, or never
        seen_mine.append(mine in found)
        nothing = {"frames": [], "seq": 0, "composer_key": None, "as_of": 0}
        stored_by_them.append(found.get(mine) or nothing)
        live_shared.put({theirs: stored_by_them[0]})

    other = threading.Thread(target=other_process)
    other.start()
    updates = render_batch(pulls)
    other.join(90)
    assert seen_mine == [True]
    assert updates[1] is not None and updates[1].dump() == stored_by_them[0]


def test_a_claim_lasts_as_long_as_the_others_wait_for_it(settings: Any) -> None:
    """A claimer slower than CLAIM_SECONDS keeps its claim while others still wait for its
    render: an expired claim let another pull claim the key again and render it twice."""
    if connection.vendor != "postgresql":
        pytest.skip("needs Redis")
    settings.AERO_LIVE_SHARE_WAIT_SECONDS = 7.5
    key = live_shared.key_of("claim-ttl-test", 0, 1, ["operator"], None, "en")
    client = live_shared._redis()
    assert client is not None
    client.delete(f"{key}:claim", key)
    try:
        assert live_shared.claim([key]) == ({}, [])  # claimed here
        assert 7 < client.ttl(f"{key}:claim") <= 8
        assert live_shared.claim([key]) == ({}, [key])  # another pull: claimed already
    finally:
        client.delete(f"{key}:claim", key)
