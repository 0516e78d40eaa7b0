"""Live push: a small notice {session, seq} after commit. Viewers pull the events.

channels_redis drops messages over capacity, so a notice carries no content: the
consumer reads what it has not sent yet from the event log.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from aero import metrics

logger = logging.getLogger("diagnosis.push")

# The ASGI server's event loop, when this process serves WebSockets. The in-memory layer
# (embedded mode) only wakes consumers when used from that loop, so job threads hand
# their sends to it instead of spinning up a loop of their own.
_server_loop: asyncio.AbstractEventLoop | None = None


def register_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _server_loop
    _server_loop = loop


def session_group(session_id: Any) -> str:
    return f"session-{getattr(session_id, 'hex', str(session_id).replace('-', ''))}"


def group_send(group: str, message: dict[str, Any]) -> None:
    """Best effort: a failed push is logged, never raised (clients catch up by seq)."""
    layer = get_channel_layer()
    if layer is None:
        return

    def send() -> None:
        try:
            async_to_sync(layer.group_send)(group, message)
        except Exception:
            logger.warning("push to %s failed", group, exc_info=True)
            metrics.push_outcome(False)
        else:
            metrics.push_outcome(True)

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    loop = _server_loop
    if loop is not None and loop.is_running() and loop is not running:
        future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
        try:
            future.result(timeout=5)
        except Exception:
            logger.warning("push to %s failed", group, exc_info=True)
            metrics.push_outcome(False)
        else:
            metrics.push_outcome(True)
        return
    if running is None:
        send()
        return
    # async_to_sync refuses to run in a thread with a running loop: use a fresh thread.
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    thread.join(timeout=5)


def notify_session(session_id: Any, seq: int) -> None:
    group_send(session_group(session_id), {"type": "session.notice", "seq": seq})
