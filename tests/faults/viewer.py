"""A live session page as the browser keeps it open, for the fault tests: one WebSocket
to daphne, re-opened whenever it closes with the last seq the page holds (what
static/aero/aero.js asks for on htmx's reconnect), in a thread of its own."""

from __future__ import annotations

import re
import threading
import time

from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

# A timeline row: its id and its seq say the same number.
ROW = re.compile(r'<li id="event-(\d+)" data-seq="(\d+)"')
RECONNECT_SECONDS = 1.0  # htmx's ws extension waits about this long before its first retry


class LiveViewer:
    def __init__(self, base: str, session: str, cookie: str) -> None:
        self.base = base
        self.session = session
        self.cookie = cookie
        self.seqs: list[int] = []
        self.arrived: list[float] = []  # time.monotonic() each row arrived
        self.connects = 0
        self.failures: list[str] = []  # why each socket ended or could not open
        self.done = threading.Event()
        self.dropping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="live-viewer")

    def __enter__(self) -> LiveViewer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(timeout=10)

    def drop(self) -> None:
        """Close the socket (a page reloaded, a network blip): the page opens a new one."""
        self.dropping.set()

    @property
    def last(self) -> int:
        return self.seqs[-1] if self.seqs else 0

    def _url(self) -> str:
        ws = self.base.replace("http://", "ws://")
        return f"{ws}/ws/sessions/{self.session}/?lang=en&last_seq={self.last}"

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                with connect(
                    self._url(),
                    open_timeout=5,
                    additional_headers={"Cookie": self.cookie, "Origin": self.base},
                ) as ws:
                    self.connects += 1
                    while not self.done.is_set():
                        if self.dropping.is_set():
                            self.dropping.clear()
                            break
                        try:
                            message = ws.recv(timeout=0.5)
                        except TimeoutError:
                            continue
                        assert isinstance(message, str)
                        for row_id, seq in ROW.findall(message):
                            assert row_id == seq
                            self.seqs.append(int(seq))
                            self.arrived.append(time.monotonic())
            except (ConnectionClosed, InvalidHandshake, OSError, TimeoutError) as exc:
                self.failures.append(f"{type(exc).__name__}: {str(exc)[:120]}")
                self.done.wait(RECONNECT_SECONDS)
