"""Live push: a small notice {session, seq} after commit. Viewers pull the events.

channels_redis drops messages over capacity, so a notice carries no content: the
consumer reads what it has not sent yet from the event log.

Notices go out on one long-lived event loop per process (channels_redis keeps its
connection pool per loop, so the connection is reused): the ASGI server's loop in the
web process, a daemon "aero-push" thread's loop anywhere else (workers, the CLI).
Callers publish from `transaction.on_commit`, never inside a transaction. A caller does
not wait for its notice to go out: at exit, the process waits for the ones
still on their way (`flush`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import hashlib
import logging
import os
import threading
import uuid
from typing import Any

from channels.layers import get_channel_layer

from aero import metrics, stamps

logger = logging.getLogger("diagnosis.push")

# The ASGI server's event loop, when this process serves WebSockets. The in-memory layer
# (embedded mode) only wakes consumers when used from that loop.
_server_loop: asyncio.AbstractEventLoop | None = None
PUBLISH_TIMEOUT = 5.0


def register_server_loop(loop: asyncio.AbstractEventLoop) -> None:
    global _server_loop
    _server_loop = loop


def session_group(session_id: Any) -> str:
    return f"session-{getattr(session_id, 'hex', str(session_id).replace('-', ''))}"


def user_group(user_id: Any) -> str:
    """A user's page sockets, told when one of the user's sign-ins ends."""
    return f"user-{user_id}"


def session_digest(session_key: str) -> str:
    """A sign-in session named in a notice: never its key (the key is the cookie)."""
    return hashlib.sha256(session_key.encode()).hexdigest()[:32]


def notify_signed_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """On sign-out (user_logged_out, before Django flushes the session): the page sockets
    opened with this sign-in close (consumers.SignedInSocket)."""
    key = getattr(getattr(request, "session", None), "session_key", None)
    if user is not None and getattr(user, "pk", None) is not None and key:
        group_send(user_group(user.pk), {"type": "auth.ended", "session": session_digest(key)})


class _Publisher:
    """A loop running forever in a daemon thread, created once per process (a forked
    child gets its own: threads do not survive a fork)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="aero-push")
        self.thread.start()


_publisher: _Publisher | None = None
_publisher_lock = threading.Lock()


def _publish_loop() -> asyncio.AbstractEventLoop:
    global _publisher
    server = _server_loop
    if server is not None and server.is_running():
        return server
    with _publisher_lock:
        if _publisher is None or _publisher.pid != os.getpid():
            _publisher = _Publisher()
        return _publisher.loop


async def _send(layer: Any, group: str, message: dict[str, Any]) -> None:
    try:
        # Bounded: with Redis hanging, notices must not pile up on the loop unanswered.
        async with asyncio.timeout(PUBLISH_TIMEOUT):
            await layer.group_send(group, message)
    except Exception:
        logger.warning("push to %s failed", group, exc_info=True)
        metrics.push_outcome(False)
    else:
        metrics.push_outcome(True)


# The notices handed to the publishing loop and not sent yet (`flush` waits for them).
_pending: set[concurrent.futures.Future[None]] = set()
_pending_lock = threading.Lock()


def _sent(future: concurrent.futures.Future[None]) -> None:
    with _pending_lock:
        _pending.discard(future)


def group_send(group: str, message: dict[str, Any]) -> None:
    """Best effort: a failed push is logged, never raised (clients catch up by seq). The
    caller does not wait for the send: a job's commit is followed by its next
    step at once, not by a hop to the publishing thread and a round trip to Redis (two
    to four per job, on the path of every session behind it). `flush` (run at exit)
    waits for the notices still on their way, so a process that exits right after a
    commit still sends its last one."""
    layer = get_channel_layer()
    if layer is None:
        return
    loop = _publish_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        loop.create_task(_send(layer, group, message))  # cannot wait on our own loop
        return
    future = asyncio.run_coroutine_threadsafe(_send(layer, group, message), loop)
    with _pending_lock:
        _pending.add(future)
    future.add_done_callback(_sent)


def flush(timeout: float = PUBLISH_TIMEOUT) -> bool:
    """Wait (at most `timeout` seconds) for the notices handed out so far to be sent.
    True when none is left on its way."""
    with _pending_lock:
        pending = list(_pending)
    if not pending:
        return True
    _, not_done = concurrent.futures.wait(pending, timeout=timeout)
    if not_done:
        logger.warning("%d live notice(s) not sent before exit", len(not_done))
    return not not_done


# Before the interpreter stops the publishing thread (a daemon): a CLI command or a
# worker that exits right after its last commit still sends that commit's notice.
atexit.register(flush)


def notify_session(session_id: Any, seq: int) -> None:
    group_send(session_group(session_id), {"type": "session.notice", "seq": seq})


# A pack's board and the to-dos page: "the restrictions or to-dos changed".
BOARD_GROUP = "board"


def notify_board() -> None:
    """Tell every open board and to-dos page to re-read, after commit. Call inside the
    transaction that changed a restriction or a to-do."""
    from django.db import transaction

    transaction.on_commit(_board_changed)


def _board_changed() -> None:
    # The approval queue's cards show the board: its pages' stamp moves first.
    stamps.touch_now(stamps.QUEUE)
    group_send(BOARD_GROUP, {"type": "board.notice", "stamp": uuid.uuid4().hex})
