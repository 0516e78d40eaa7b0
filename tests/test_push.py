"""A commit's live notice is handed to the publishing thread, not waited for:
the job's next step follows its commit at once; `flush` (at exit) sends what is left."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from diagnosis import push


class HeldLayer:
    """A channel layer whose sends wait until the test lets them go."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.sent: list[tuple[str, dict[str, Any]]] = []

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 10)
        self.sent.append((group, message))


def test_a_notice_is_not_waited_for_and_flush_sends_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    layer = HeldLayer()
    monkeypatch.setattr(push, "get_channel_layer", lambda: layer)
    # A caller that waited would give up on the held send after this and log it.
    monkeypatch.setattr(push, "PUBLISH_TIMEOUT", 0.2)
    with caplog.at_level(logging.WARNING, logger="diagnosis.push"):
        push.notify_session("0f0e0d0c-0b0a-0908-0706-050403020100", 7)
        assert layer.sent == []  # returned with the send still held
        layer.release.set()
        assert push.flush(timeout=5)
    assert layer.sent == [
        ("session-0f0e0d0c0b0a09080706050403020100", {"type": "session.notice", "seq": 7})
    ]
    assert not [r for r in caplog.records if "timed out" in r.getMessage()]


def test_flush_says_when_a_notice_is_still_on_its_way(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = HeldLayer()
    monkeypatch.setattr(push, "get_channel_layer", lambda: layer)
    push.notify_session("0f0e0d0c-0b0a-0908-0706-050403020100", 8)
    assert push.flush(timeout=0.1) is False
    layer.release.set()
    assert push.flush(timeout=5) is True
    assert [message["seq"] for _, message in layer.sent] == [8]
