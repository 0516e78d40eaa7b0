"""One notice, many viewers in one process: the hub receives it once, checks the viewers'
roles in one read, renders once per role set and writes the same frames to every viewer
of that set; a viewer that goes away mid-fan-out costs the others nothing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import channels.consumer
import channels.generic.websocket
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.db import connections

from aero.asgi import page_websocket
from diagnosis import consumers, live_access, live_hub, live_render, live_shared
from diagnosis.events import append_event
from diagnosis.models import Session
from diagnosis.presenters import composer_key
from tests.test_live_access import run_in_fresh_loop
from tests.test_live_timeline import SEQ, cookie_for, new_session

pytestmark = pytest.mark.services

# Needs an approval: approvers see decision forms in the actions panel, operators never.
WITH_APPROVAL = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"


class Counts:
    """What the process did for the notices under test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pulls: list[live_render.Pull] = []
        self.role_reads = 0
        self.notices = 0
        real_batch, real_roles = live_render.render_batch, live_access.current_roles
        real_notice = live_hub.Hub.notice

        def counted_batch(batch: list[live_render.Pull]) -> Any:
            self.pulls.extend(batch)
            return real_batch(batch)

        def counted_roles(user_ids: Any) -> Any:
            self.role_reads += 1
            return real_roles(user_ids)

        def counted_notice(hub: live_hub.Hub, session_id: str, seq: int) -> None:
            self.notices += 1
            real_notice(hub, session_id, seq)

        monkeypatch.setattr(live_render, "render_batch", counted_batch)
        monkeypatch.setattr(live_access, "current_roles", counted_roles)
        monkeypatch.setattr(live_hub.Hub, "notice", counted_notice)

    def now(self) -> tuple[int, int, int]:
        return len(self.pulls), self.role_reads, self.notices


def cookies_for(users: list[User]) -> list[bytes]:
    """Logged-in cookies, made in the test's thread (a login inside the event loop's
    thread would leave that thread's database connection open)."""
    return [cookie_for(user).encode() for user in users]


async def connect_all(session: Session, cookies: list[bytes]) -> list[WebsocketCommunicator]:
    path = f"/ws/sessions/{session.pk}/?last_seq={session.last_seq}&lang=en"
    viewers = []
    for cookie in cookies:
        headers = [(b"origin", b"http://testserver"), (b"host", b"testserver"), (b"cookie", cookie)]
        viewer = WebsocketCommunicator(page_websocket, path, headers=headers)
        connected, _ = await viewer.connect(timeout=10)
        assert connected
        viewers.append(viewer)
    await asyncio.sleep(0.3)  # their catch-up pulls at connect (nothing new) are done
    return viewers


async def close_all(viewers: list[WebsocketCommunicator]) -> None:
    for viewer in viewers:
        await viewer.disconnect()
    await database_sync_to_async(connections.close_all)()  # this thread's connection


async def status_event(session: Session) -> int:
    """An event that re-renders the actions panel (where decision forms live)."""
    event = await database_sync_to_async(append_event)(
        session.pk,
        "session.status_changed",
        {"from": "waiting_approval", "to": "waiting_approval"},
        producer="t",
    )
    return event.seq


@pytest.mark.parametrize("per_role", [1, 12])
def test_a_notice_costs_one_render_per_role_set_whatever_the_number_of_viewers(
    per_role: int,
    builtin: None,
    make_user: Callable[..., User],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operators = [make_user(f"op{n}", "operator") for n in range(per_role)]
    approvers = [make_user(f"ap{n}", "approver") for n in range(per_role)]
    session = new_session(operators[0], WITH_APPROVAL)
    cookies = cookies_for(operators + approvers)
    counts = Counts(monkeypatch)

    async def watch() -> tuple[tuple[int, int, int], list[str], int]:
        viewers = await connect_all(session, cookies)
        before = counts.now()
        seq = await status_event(session)
        received = [await viewer.receive_from(timeout=10) for viewer in viewers]
        await asyncio.sleep(0.5)  # any second round of the fan-out runs now
        spent = tuple(now - then for now, then in zip(counts.now(), before, strict=True))
        await close_all(viewers)
        return spent, received, seq  # type: ignore[return-value]

    (renders, role_reads, notices), received, seq = run_in_fresh_loop(watch)
    assert (renders, role_reads, notices) == (2, 1, 1)  # 2 viewers or 24: the same work
    for html in received:
        assert [int(s) for s in SEQ.findall(html)] == [seq]
    # Same roles, same frames; masking per role set, never mixed.
    for_operators, for_approvers = set(received[:per_role]), set(received[per_role:])
    assert len(for_operators) == 1 and len(for_approvers) == 1
    assert 'name="decision"' in next(iter(for_approvers))
    assert 'name="decision"' not in next(iter(for_operators))


def test_viewers_that_go_away_mid_fan_out_do_not_stop_the_others(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second viewer closes its socket while the notice's render runs, the fourth
    one's socket breaks as its frame is written (the hub writes in join order, so both
    come before others): every other viewer still gets each event, once."""
    users = [make_user(f"op{n}", "operator") for n in range(6)]
    gone_user, broken_user = users[1], users[3]
    session = new_session(users[0], WITH_APPROVAL)
    cookies = cookies_for(users)
    real_batch, real_send = live_render.render_batch, consumers.SessionConsumer.send
    during_render: list[Callable[[], None]] = []

    def render_then(batch: list[live_render.Pull]) -> Any:
        while during_render:
            during_render.pop()()  # in the sync thread: the event loop is free meanwhile
        return real_batch(batch)

    async def send_or_break(consumer: consumers.SessionConsumer, *args: Any, **kw: Any) -> None:
        if consumer.user_id == broken_user.pk:
            raise ConnectionResetError("the socket broke")
        await real_send(consumer, *args, **kw)

    monkeypatch.setattr(live_render, "render_batch", render_then)
    monkeypatch.setattr(consumers.SessionConsumer, "send", send_or_break)

    async def watch() -> tuple[list[list[int]], list[int], bool]:
        loop = asyncio.get_running_loop()
        viewers = await connect_all(session, cookies)
        gone = viewers[users.index(gone_user)]
        others = [
            v for u, v in zip(users, viewers, strict=True) if u not in (gone_user, broken_user)
        ]
        during_render.append(
            lambda: asyncio.run_coroutine_threadsafe(gone.disconnect(), loop).result(10)
        )
        sent = [await status_event(session), await status_event(session)]
        got: list[list[int]] = [[] for _ in others]
        for mine, viewer in zip(got, others, strict=True):
            while len(mine) < 2:
                mine += [int(s) for s in SEQ.findall(await viewer.receive_from(timeout=10))]
        nothing_more = all([await viewer.receive_nothing(timeout=0.5) for viewer in others])
        await close_all([v for v in viewers if v is not gone])
        return got, sent, nothing_more

    got, sent, nothing_more = run_in_fresh_loop(watch)
    assert got == [sent] * 4  # nothing lost, nothing twice
    assert nothing_more


def test_sockets_opening_at_once_all_connect_and_get_each_event_once(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of page sockets (a page's viewers reconnecting after a restart): their
    sign-ins are read together, in a few database calls rather than one per socket (one
    each queued every other database call behind the whole burst, and daphne refused
    the sockets it had not answered in time), with no hop to channels' one sync thread;
    every viewer signed in connects and gets the next event once; forged cookies in the
    same burst are refused."""
    from aero import serving, sessions

    users = [make_user(f"op{n}", "operator") for n in range(5)]
    session = new_session(users[0], WITH_APPROVAL)
    cookies = cookies_for(users) * 6  # 30 sockets, 5 sign-ins
    lookups: list[list[str]] = []

    def counted_lookup(keys: list[str]) -> dict[str, Any]:
        lookups.append(list(keys))
        return sessions.users_signed_in(keys)

    monkeypatch.setattr(serving._signed_in_user, "func", counted_lookup)
    hops: list[str] = []

    async def counted_close() -> None:
        hops.append("close")

    monkeypatch.setattr(channels.consumer, "aclose_old_connections", counted_close)
    monkeypatch.setattr(channels.generic.websocket, "aclose_old_connections", counted_close)
    path = f"/ws/sessions/{session.pk}/?last_seq={session.last_seq}&lang=en"

    def socket(cookie: bytes) -> WebsocketCommunicator:
        headers = [(b"origin", b"http://testserver"), (b"host", b"testserver"), (b"cookie", cookie)]
        return WebsocketCommunicator(page_websocket, path, headers=headers)

    async def watch() -> tuple[list[bool], bool, list[list[int]], int, int]:
        viewers = [socket(cookie) for cookie in cookies]
        forged = socket(b"sessionid=forged" + b"0" * 25)
        # A key the database cannot even compare: refused, and it fails no one else's.
        broken = socket(b"sessionid=forged\x00" + b"0" * 24)
        opened = await asyncio.gather(*(v.connect(timeout=30) for v in [*viewers, forged, broken]))
        await asyncio.sleep(0.3)  # their catch-up pulls at connect (nothing new) are done
        seq = await status_event(session)
        received = [
            [int(s) for s in SEQ.findall(await viewer.receive_from(timeout=30))]
            for viewer in viewers
        ]
        repeated = [not await viewer.receive_nothing(timeout=0.5) for viewer in viewers]
        await close_all(viewers)
        forged_opened = opened[-2][0] or opened[-1][0]
        return [ok for ok, _ in opened[:-2]], forged_opened, received, seq, sum(repeated)

    opened, forged_opened, received, seq, repeated = run_in_fresh_loop(watch)
    assert opened == [True] * 30
    assert not forged_opened
    assert received == [[seq]] * 30 and repeated == 0
    # Every sign-in looked up, in one batch or a few: never one call per socket.
    keys = {cookie.decode().split("=", 1)[1] for cookie in cookies}
    forged_keys = {"forged" + "0" * 25, "forged\x00" + "0" * 24}
    assert {key for batch in lookups for key in batch} == keys | forged_keys
    assert 1 <= len(lookups) <= 3
    assert hops == []


def test_a_burst_over_many_sessions_reads_their_masks_once_and_delivers_each_event_once(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notices for several sessions at once, watched by auditors (masked) and operators:
    the batch reads the masks of all its sessions in one query (one per session made a
    burst over a thousand sessions a thousand queries), and every viewer gets each
    event of its own session once, in order."""
    from diagnosis.eventlog import masking

    operator, auditor = make_user("olga", "operator"), make_user("carol", "auditor")
    sessions = [new_session(operator, WITH_APPROVAL) for _ in range(4)]
    cookies = cookies_for([operator, auditor])
    batches: list[int] = []
    mask_reads: list[list[str]] = []
    real_batch, real_hidden = live_render.render_batch, masking.hidden_by_session

    def counted_batch(pulls: list[live_render.Pull]) -> Any:
        batches.append(len({pull.session_id for pull in pulls}))
        return real_batch(pulls)

    def counted_hidden(session_ids: Any) -> Any:
        mask_reads.append([str(s) for s in session_ids])
        return real_hidden(session_ids)

    monkeypatch.setattr(live_render, "render_batch", counted_batch)
    monkeypatch.setattr(live_render, "hidden_by_session", counted_hidden)
    monkeypatch.setattr(masking, "hidden_by_session", counted_hidden)

    async def watch() -> tuple[list[list[int]], dict[str, list[int]]]:
        viewers = {str(s.pk): await connect_all(s, cookies) for s in sessions}
        batches.clear()
        mask_reads.clear()
        appended: dict[str, list[int]] = {key: [] for key in viewers}
        for _ in range(2):  # two events per session, the sessions interleaved
            for session in sessions:
                appended[str(session.pk)].append(await status_event(session))
        received = []
        for key, watchers in viewers.items():
            for viewer in watchers:
                seqs: list[int] = []
                while len(seqs) < len(appended[key]):
                    seqs += [int(s) for s in SEQ.findall(await viewer.receive_from(timeout=30))]
                assert await viewer.receive_nothing(timeout=0.3)  # nothing twice
                received.append(seqs)
        for watchers in viewers.values():
            await close_all(watchers)
        return received, appended

    received, appended = run_in_fresh_loop(watch)
    assert received == [seqs for seqs in appended.values() for _ in range(2)]
    # Masks read at most once per batch, never one query per session of a batch.
    assert max(batches) > 1  # the burst did batch sessions together
    assert 1 <= len(mask_reads) <= len(batches)


def test_notices_arriving_while_a_fan_out_runs_join_one_batch(
    builtin: None, make_user: Callable[..., User], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One fan-out batch at a time per process: the notices of four sessions that arrive
    while the first session's batch is in its database call wait, and then cost one
    batch together, with as many queries as the first batch's one session (not one
    fan-out, and its queries, per session); every viewer still gets its event once."""
    import threading

    from django.test.utils import CaptureQueriesContext

    operator = make_user("olga", "operator")
    sessions = [new_session(operator, WITH_APPROVAL) for _ in range(5)]
    cookie = cookies_for([operator])[0]
    batches: list[tuple[set[str], int]] = []  # (sessions, queries) of each checked batch
    first_running, release = threading.Event(), threading.Event()
    real_check = live_access.check_and_render

    def counted_check(asks: list[live_access.Ask]) -> Any:
        if not batches:
            first_running.set()
            release.wait(20)  # the database call is under way: the other notices arrive
        with CaptureQueriesContext(connections["default"]) as queries:
            answers = real_check(asks)
        batches.append(({ask.session_id for ask in asks}, len(queries.captured_queries)))
        return answers

    async def note(session: Session) -> int:
        # No panel changes and the page's answer box given: rows only, no panel reads.
        event = await database_sync_to_async(append_event)(
            session.pk, "agent.note", {"text": "t"}, producer="t"
        )
        return event.seq

    async def watch() -> tuple[list[list[int]], list[int], bool]:
        viewers = []
        for session in sessions:
            path = (
                f"/ws/sessions/{session.pk}/?last_seq={session.last_seq}&lang=en"
                f"&composer={quote(composer_key(session))}"
            )
            headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
            viewer = WebsocketCommunicator(
                page_websocket, path, headers=[*headers, (b"cookie", cookie)]
            )
            assert (await viewer.connect(timeout=10))[0]
            viewers.append(viewer)
        await asyncio.sleep(0.3)  # their catch-up pulls at connect are done
        monkeypatch.setattr(live_access, "check_and_render", counted_check)
        hub = live_hub.hub()
        seqs = [await note(sessions[0])]
        assert await asyncio.to_thread(first_running.wait, 10)
        seqs += [await note(session) for session in sessions[1:]]

        def waiting() -> int:
            return len({ask.session_id for asks, _ in hub.pending_asks for ask in asks})

        for _ in range(200):  # the four notices reached the hub and wait for the batch
            if waiting() == 4:
                break
            await asyncio.sleep(0.02)
        release.set()
        got = []
        for viewer in viewers:
            got.append([int(s) for s in SEQ.findall(await viewer.receive_from(timeout=10))])
        nothing_more = all([await viewer.receive_nothing(timeout=0.3) for viewer in viewers])
        await close_all(viewers)
        return got, seqs, nothing_more

    got, seqs, nothing_more = run_in_fresh_loop(watch)
    release.set()
    assert got == [[seq] for seq in seqs] and nothing_more
    ids = [str(session.pk) for session in sessions]
    assert [found for found, _ in batches] == [{ids[0]}, set(ids[1:])]
    (_, one), (_, four) = batches
    assert four <= one  # four sessions' notices: one batch's queries at most


def claimed_by_another_process(session: Session, roles: frozenset[str]) -> str:
    """Claim the render of `session`'s next event for the page viewers with `roles` (the
    test stands for another daphne process rendering it: live_shared)."""
    key = live_shared.key_of(
        str(session.pk), session.last_seq, session.last_seq + 1, roles, composer_key(session), "en"
    )
    assert live_shared.claim([key]) == ({}, [])  # claimed here, not by the hub
    return key


async def page_viewer(session: Session, cookie: bytes) -> WebsocketCommunicator:
    path = (
        f"/ws/sessions/{session.pk}/?last_seq={session.last_seq}&lang=en"
        f"&composer={quote(composer_key(session))}"
    )
    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver"), (b"cookie", cookie)]
    viewer = WebsocketCommunicator(page_websocket, path, headers=headers)
    assert (await viewer.connect(timeout=10))[0]
    return viewer


async def note(session: Session) -> int:
    event = await database_sync_to_async(append_event)(
        session.pk, "agent.note", {"text": "t"}, producer="t"
    )
    return event.seq


def test_a_render_another_process_claimed_holds_back_no_other_session(
    builtin: None, make_user: Callable[..., User], settings: Any
) -> None:
    """Two sessions' notices; the first's render is claimed by another process, which
    stores it only once the second session's viewer has its event: the hub fetches it
    then (not rendered here), and the second session's viewer did not wait for it (a
    batch waited for another process's renders, up to AERO_LIVE_SHARE_WAIT_SECONDS,
    before any of its viewers got theirs)."""
    settings.AERO_LIVE_SHARE_WAIT_SECONDS = 5.0
    operator = make_user("olga", "operator")
    claimed, other = (new_session(operator, WITH_APPROVAL) for _ in range(2))
    cookie = cookies_for([operator])[0]
    key = claimed_by_another_process(claimed, frozenset({"operator"}))

    async def watch() -> tuple[str, str, int, int]:
        waiting, free = await page_viewer(claimed, cookie), await page_viewer(other, cookie)
        await asyncio.sleep(0.3)  # their catch-up pulls at connect are done
        claimed_seq = await note(claimed)
        other_seq = await note(other)
        got_other = await free.receive_from(timeout=10)
        # Only now does the other process store its render (marked, to tell it apart).
        stored = f'<div id="stored-elsewhere" data-seq="{claimed_seq}"></div>'
        await database_sync_to_async(live_shared.put)(
            {
                key: {
                    "frames": [stored],
                    "seq": claimed_seq,
                    "composer_key": composer_key(claimed),
                    "as_of": claimed_seq,
                }
            }
        )
        got_claimed = await waiting.receive_from(timeout=10)
        assert await waiting.receive_nothing(timeout=0.3)
        assert await free.receive_nothing(timeout=0.3)
        await close_all([waiting, free])
        return got_claimed, got_other, claimed_seq, other_seq

    got_claimed, got_other, claimed_seq, other_seq = run_in_fresh_loop(watch)
    assert [int(s) for s in SEQ.findall(got_other)] == [other_seq]
    assert got_claimed == f'<div id="stored-elsewhere" data-seq="{claimed_seq}"></div>'


def test_a_render_another_process_never_stores_reaches_its_viewers_all_the_same(
    builtin: None, make_user: Callable[..., User], settings: Any
) -> None:
    """The other process died after claiming the render: once the wait is over, the
    viewers pull on their own and get the event, once."""
    settings.AERO_LIVE_SHARE_WAIT_SECONDS = 0.5
    operator = make_user("olga", "operator")
    claimed = new_session(operator, WITH_APPROVAL)
    cookie = cookies_for([operator])[0]
    claimed_by_another_process(claimed, frozenset({"operator"}))

    async def watch() -> tuple[list[int], int, bool]:
        viewer = await page_viewer(claimed, cookie)
        await asyncio.sleep(0.3)
        seq = await note(claimed)
        got = [int(s) for s in SEQ.findall(await viewer.receive_from(timeout=15))]
        nothing_more = await viewer.receive_nothing(timeout=0.5)
        await close_all([viewer])
        return got, seq, nothing_more

    got, seq, nothing_more = run_in_fresh_loop(watch)
    assert got == [seq] and nothing_more


def test_waiting_for_another_process_s_render_takes_no_database_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wait polls Redis for up to AERO_LIVE_SHARE_WAIT_SECONDS: on a database pool
    thread (aero.db_async, AERO_ASGI_DB_THREADS) it held one of the few that run the
    fan-outs' queries, and paid their connection handling for no query."""
    threads: list[str] = []

    def wait_for(keys: list[str]) -> dict[str, dict[str, Any]]:
        threads.append(threading.current_thread().name)
        return {key: {"frames": [], "seq": 1, "composer_key": None, "as_of": 1} for key in keys}

    monkeypatch.setattr(live_shared, "wait_for", wait_for)

    async def wait() -> dict[str, dict[str, Any]]:
        return await live_hub.Hub().claimed_renders(["k"])

    assert set(run_in_fresh_loop(wait)) == {"k"}
    assert len(threads) == 1 and not threads[0].startswith("aero-db")
