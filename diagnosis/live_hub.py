"""The process's hub: one subscription to each watched session's notices, fanned out to
the viewers here; shared renders and batched role checks.

One notice per process, not per viewer: the hub holds one subscription to each
session watched in this process (a channel of its own in the session's group) and fans a
notice out itself: the idle viewers behind it get their roles read in one query and one
render per role set (one database call, batched with other sessions' fan-outs), then the
same frames written to each, one after another. A viewer whose socket breaks meanwhile
is skipped; one already pulling pulls again on its own, under its lock.

A notice can be lost (Redis down or restarting, a channel over its capacity): the hub
also re-reads the last seq of every session watched in this process every
AERO_LIVE_RESYNC_SECONDS, in one query, and wakes the viewers behind it, so the newest
event reaches an idle page with no further notice."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Protocol

from channels.layers import get_channel_layer
from django.conf import settings

from aero import metrics
from aero.db_async import Batched, db_call
from aero.sessions import Viewer
from diagnosis import live_access, live_render, live_shared
from diagnosis.live_access import Ask
from diagnosis.live_render import Claimed, Pull, Update
from diagnosis.live_write import Broadcast
from diagnosis.push import session_group

RENDER_CACHE_SIZE = 256

logger = logging.getLogger("diagnosis.live_hub")


class Watcher(Protocol):
    """A live viewer of one session's events (the page's timeline, the API stream)."""

    sent_seq: int

    async def catch_up(self) -> None: ...


class PageViewer:
    """A viewer the hub's fan-out serves itself (the session page's socket): idle ones
    (`flushing` free) are checked and rendered together and handed the same frames by
    `apply`; any other watcher pulls on its own."""

    user_id: Any = None
    session_key: str | None = None
    sent_seq: int = 0
    composer_key: str | None = None
    language: str | None = None
    roles: frozenset[str] = frozenset()
    flushing: asyncio.Lock

    async def apply(
        self, roles: frozenset[str] | None, update: Update | None, broadcast: Broadcast
    ) -> bool:
        raise NotImplementedError

    async def catch_up(self) -> None:
        raise NotImplementedError


# A hub's channel in one session's group, and the task that reads its notices.
Subscription = tuple[str, asyncio.Task[None]]


class Hub:
    """Per process (and event loop): one subscription to each watched session's notices,
    fanned out to its viewers here; shared renders and batched role checks."""

    def __init__(self) -> None:
        self.renders: OrderedDict[Hashable, asyncio.Future[Any]] = OrderedDict()
        self.latest: dict[str, int] = {}  # session -> highest seq a notice announced
        # One query per batch: the viewers one notice woke all ask within a few loop
        # turns, and those asking while a query runs join the next one.
        self.roles: Batched[Viewer, frozenset[str]] = Batched(live_access.viewer_roles, frozenset())
        # session -> its viewers here, in the order they joined (a dict as an ordered set):
        # a fan-out writes to them in that order.
        self.watchers: dict[str, dict[Watcher, None]] = {}
        self.resync_task: asyncio.Task[None] | None = None
        self.catching_up: set[asyncio.Future[None]] = set()
        self.pending_pulls: dict[Pull, asyncio.Future[Update | None]] = {}
        self.pulls_task: asyncio.Task[None] | None = None
        # session -> this process's subscription to its notices (a channel of the hub's
        # in the session's group, and the task reading it), shared by all its viewers.
        self.subscriptions: dict[str, asyncio.Future[Subscription]] = {}
        self.fanning: dict[str, asyncio.Task[None]] = {}  # session -> its running fan-out
        self.pending_asks: list[tuple[list[Ask], asyncio.Future[Any]]] = []
        self.asks_task: asyncio.Task[None] | None = None

    # --- access -----------------------------------------------------------------------

    async def roles_of(self, user_id: Any, session_key: str | None) -> frozenset[str]:
        """The viewer's roles now; none once the sign-in `session_key` has ended."""
        if user_id is None or not session_key:
            return frozenset()
        return await self.roles((user_id, session_key))

    # --- resync -----------------------------------------------------------------------

    def watch(self, session_id: str, viewer: Watcher) -> None:
        self.watchers.setdefault(session_id, {})[viewer] = None
        interval = float(settings.AERO_LIVE_RESYNC_SECONDS)
        if interval > 0 and self.resync_task is None:
            self.resync_task = asyncio.ensure_future(self._resync(interval))

    def unwatch(self, session_id: str, viewer: Watcher) -> None:
        viewers = self.watchers.get(session_id)
        if viewers is not None:
            viewers.pop(viewer, None)
            if not viewers:
                del self.watchers[session_id]

    async def _resync(self, interval: float) -> None:
        """Every `interval` while anyone watches: one query for the last seq of every
        watched session; each viewer behind it pulls (its own lock keeps that pull from
        overlapping one a notice started, so nothing is sent twice)."""
        try:
            while self.watchers:
                await asyncio.sleep(interval)
                if not self.watchers:
                    return
                try:
                    found = await db_call(live_access.last_seqs)(list(self.watchers))
                except Exception:
                    # PostgreSQL restarting: the next pass reads again.
                    logger.warning("live resync: could not read the sessions", exc_info=True)
                    continue
                for session_id, last in found.items():
                    self.notice(session_id, last)
        finally:
            self.resync_task = None

    # --- notices: one subscription per session and process, fanned out here ------------

    async def join(self, session_id: str, viewer: Watcher) -> None:
        """Watch `session_id`: its notices reach `viewer` through this hub. The first
        viewer of a session in this process subscribes the hub to the session's group (one
        channel-layer message per notice and process, not one per viewer); the others
        wait for that subscription, so a notice published once `join` returns is seen."""
        self.watch(session_id, viewer)
        subscription = self.subscriptions.get(session_id)
        if subscription is None:
            subscription = asyncio.ensure_future(self._subscribe(session_id))
            self.subscriptions[session_id] = subscription
        try:
            await asyncio.shield(subscription)
        except Exception:
            # Redis unreachable: the next viewer tries again; this one is refused.
            if self.subscriptions.get(session_id) is subscription:
                del self.subscriptions[session_id]
            self.unwatch(session_id, viewer)
            raise

    async def leave(self, session_id: str, viewer: Watcher) -> None:
        """`viewer` stops watching; the last viewer of a session in this process ends the
        hub's subscription (a later viewer makes a new one, on a new channel)."""
        self.unwatch(session_id, viewer)
        if session_id in self.watchers or session_id not in self.subscriptions:
            return
        subscription = self.subscriptions.pop(session_id)
        try:
            channel, reader = await subscription
        except Exception:
            return  # it never subscribed
        try:
            await get_channel_layer().group_discard(session_group(session_id), channel)
        finally:
            reader.cancel()

    async def _subscribe(self, session_id: str) -> Subscription:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(session_group(session_id), channel)
        return channel, asyncio.ensure_future(self._listen(session_id, channel))

    async def _listen(self, session_id: str, channel: str) -> None:
        layer = get_channel_layer()
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Redis restarting: wait, join the group again (a flushed Redis forgot
                # it); notices lost meanwhile are made up by the resync.
                logger.warning("live notices of %s: receive failed", session_id, exc_info=True)
                await asyncio.sleep(1)
                try:
                    await layer.group_add(session_group(session_id), channel)
                except Exception:
                    logger.debug("live notices of %s: rejoin failed", session_id, exc_info=True)
                continue
            if message.get("type") == "session.notice":
                self.notice(session_id, int(message.get("seq", 0)))

    def notice(self, session_id: str, seq: int) -> None:
        """Events up to `seq` exist: bring every viewer of the session here up to it.
        One fan-out per session at a time; notices arriving while it runs only raise
        `latest`, and it goes round again (coalesced)."""
        self.announce(session_id, seq)
        if session_id not in self.fanning:
            self.fanning[session_id] = asyncio.ensure_future(self._fan_out(session_id))

    async def _fan_out(self, session_id: str) -> None:
        done = 0
        try:
            while (target := self.latest.get(session_id, 0)) > done:
                done = target
                try:
                    await self._fan_out_once(session_id, target)
                except Exception:  # a database error: the next notice or resync retries
                    logger.warning("live fan-out of %s failed", session_id, exc_info=True)
        finally:
            # Here, not in a done callback: between the last check of `latest` and a
            # callback, a notice would find this task still registered and be skipped.
            self.fanning.pop(session_id, None)

    async def _fan_out_once(self, session_id: str, target: int) -> None:
        """One round for the viewers behind `target`: the page viewers that are idle
        are checked together (one role read for their users), share one render per
        (roles, seq, answer box, language) and get the same frames, written one after
        another with no task or channel-layer message per viewer. A viewer already
        pulling (its lock held), and API streams, pull on their own, after."""
        behind = [v for v in list(self.watchers.get(session_id, ())) if v.sent_seq < target]
        pages: list[PageViewer] = []
        for viewer in behind:
            if isinstance(viewer, PageViewer) and not viewer.flushing.locked():
                await viewer.flushing.acquire()  # free: taken without waiting
                pages.append(viewer)
            else:
                self.later(viewer)
        if not pages:
            return
        try:
            asks = [
                Ask(
                    v.user_id,
                    session_id,
                    v.sent_seq,
                    v.composer_key,
                    v.language,
                    v.roles,
                    v.session_key,
                )
                for v in pages
            ]
            answers = await self.check_and_render(asks)
            # Each update's frames framed once for all the viewers it goes to.
            broadcast = Broadcast()
            # Renders another process is making: fetched once stored, off the batch (its
            # other sessions' viewers and this process's next batch do not wait for them).
            claimed: dict[str, list[tuple[PageViewer, frozenset[str]]]] = {}
            ready: list[tuple[PageViewer, frozenset[str] | None, Update | None]] = []
            for viewer, (roles, update) in zip(pages, answers, strict=True):
                if isinstance(update, Claimed) and roles is not None:
                    claimed.setdefault(update.key, []).append((viewer, roles))
                else:
                    ready.append((viewer, roles, None if isinstance(update, Claimed) else update))
            sent = await self._apply(session_id, ready, broadcast)
            if claimed:
                arrived = await self.claimed_renders(list(claimed))
                for key, viewers in claimed.items():
                    found = arrived.get(key)
                    if found is None:  # not stored in time: they pull, and render it, alone
                        for viewer, _ in viewers:
                            self.later(viewer)
                        continue
                    update = Update.load(found)
                    sent += await self._apply(
                        session_id,
                        [(viewer, roles, update) for viewer, roles in viewers],
                        broadcast,
                    )
            if sent:
                # Counted once per fan-out: a metric write per viewer (a lock and a
                # shared-file write in multi-process mode) was paid a thousand times.
                metrics.events_sent("page", sent)
            metrics.live_frames(broadcast.direct, broadcast.buffered, broadcast.asgi)
        finally:
            for viewer in pages:
                viewer.flushing.release()

    async def _apply(
        self,
        session_id: str,
        answers: list[tuple[PageViewer, frozenset[str] | None, Update | None]],
        broadcast: Broadcast,
    ) -> int:
        """Each viewer its answer, one after another; the events sent."""
        sent = 0
        for viewer, roles, update in answers:
            before = viewer.sent_seq
            try:
                caught_up = await viewer.apply(roles, update, broadcast)
            except Exception:  # this socket broke: the others still get theirs
                logger.debug("live push to a viewer of %s failed", session_id, exc_info=True)
                continue
            finally:
                sent += viewer.sent_seq - before
            if not caught_up:
                self.later(viewer)  # more than one batch behind: it pulls the rest
        return sent

    async def claimed_renders(self, keys: list[str]) -> dict[str, dict[str, Any]]:
        """The renders other processes claimed, stored within
        AERO_LIVE_SHARE_WAIT_SECONDS (live_shared.wait_for, on a thread of its own, so
        the batches go on meanwhile); the ones that were not are left out. It polls Redis
        only: not on the database pool, whose threads bound the connections."""
        found = await asyncio.to_thread(live_shared.wait_for, keys)
        metrics.live_renders(0, len(found))
        return found

    async def check_and_render(
        self, asks: list[Ask]
    ) -> list[tuple[frozenset[str] | None, Update | None]]:
        """`check_and_render` for `asks`, batched with the fan-outs of other sessions
        that ask meanwhile: one database call (one thread hop) for all of them. A render
        another process claimed comes back Claimed (live_render.leaving_claimed)."""
        future: asyncio.Future[list[tuple[frozenset[str] | None, Update | None]]]
        future = asyncio.get_running_loop().create_future()
        self.pending_asks.append((asks, future))
        if self.asks_task is None:
            self.asks_task = asyncio.ensure_future(self._check_and_render_asks())
        return await future

    async def _check_and_render_asks(self) -> None:
        try:
            await asyncio.sleep(0)
            while self.pending_asks:
                batch, self.pending_asks = self.pending_asks, []
                try:
                    answers = await db_call(_check_and_render_leaving_claimed)(
                        [ask for asks, _ in batch for ask in asks]
                    )
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                start = 0
                for asks, future in batch:
                    if not future.done():
                        future.set_result(answers[start : start + len(asks)])
                    start += len(asks)
        finally:
            self.asks_task = None

    def later(self, viewer: Watcher) -> None:
        """`viewer` pulls on its own (after any pull it is running)."""
        task = asyncio.ensure_future(viewer.catch_up())
        self.catching_up.add(task)
        task.add_done_callback(self.catching_up.discard)

    # --- renders ----------------------------------------------------------------------

    def announce(self, session_id: str, seq: int) -> None:
        if seq > self.latest.get(session_id, 0):
            self.latest[session_id] = seq

    async def shared(
        self, key: Hashable, fresh: Callable[[Any], bool], compute: Callable[[], Awaitable[Any]]
    ) -> Any:
        """The result of `compute` for `key`, computed once for every caller that asks
        while it runs and reused while `fresh(result)` holds."""
        future = self.renders.get(key)
        if (
            future is not None
            and future.done()
            and (future.cancelled() or future.exception() is not None or not fresh(future.result()))
        ):
            future = None
        if future is None:
            future = asyncio.ensure_future(compute())
            self.renders[key] = future
            while len(self.renders) > RENDER_CACHE_SIZE:
                self.renders.popitem(last=False)
        else:
            self.renders.move_to_end(key)
        return await asyncio.shield(future)

    async def session_update(
        self,
        roles: frozenset[str],
        session_id: str,
        after: int,
        composer_key: str | None,
        language: str | None = None,
    ) -> Update | None:
        # Reused only while no notice announced anything newer than the render saw: a
        # reused fragment is then exactly what a fresh render would give.
        def fresh(update: Update | None) -> bool:
            return update is not None and update.as_of >= self.latest.get(session_id, 0)

        pull = Pull(roles, session_id, after, composer_key, language)
        return await self.shared(("session", pull), fresh, lambda: self._render(pull))

    async def _render(self, pull: Pull) -> Update | None:
        future = self.pending_pulls.get(pull)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self.pending_pulls[pull] = future
        if self.pulls_task is None:
            self.pulls_task = asyncio.ensure_future(self._render_pulls())
        return await future

    async def _render_pulls(self) -> None:
        """One database call per batch of pulls (render_batch): the pulls one notice
        woke, or that many notices woke while the previous batch rendered."""
        try:
            await asyncio.sleep(0)
            while self.pending_pulls:
                batch, self.pending_pulls = self.pending_pulls, {}
                pulls = list(batch)
                try:
                    updates = await db_call(live_render.render_batch)(pulls)
                except Exception as exc:
                    for future in batch.values():
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for pull, update in zip(pulls, updates, strict=True):
                    if not batch[pull].done():
                        batch[pull].set_result(update)
        finally:
            self.pulls_task = None


def _check_and_render_leaving_claimed(
    asks: list[Ask],
) -> list[tuple[frozenset[str] | None, Update | None]]:
    with live_render.leaving_claimed():
        return live_access.check_and_render(asks)


_hubs: dict[asyncio.AbstractEventLoop, Hub] = {}


def hub() -> Hub:
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        for stale in [known for known in _hubs if known.is_closed()]:
            del _hubs[stale]
        found = _hubs[loop] = Hub()
    return found
