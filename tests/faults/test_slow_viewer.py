"""A slow WebSocket viewer past the channel layer's capacity catches up from the log with
no gap and no duplicate (issue 10). A notice carries no content: the consumer pulls what
it has not sent from PostgreSQL, so notices the layer drops lose nothing.

daphne and the process appending events run with channels_redis's core layer at a
capacity of 2 notices per channel (tests/faults/small_layer_settings.py; production's
pub/sub layer has no bound, so nothing would be dropped to test). The viewer connects
and stops reading while hundreds of events are appended, each with its notice; notices
past the capacity are dropped in Redis (counted) or in daphne's receive buffer. Then the
viewer reads everything: every seq 1..last exactly once, in order. Last, with the viewer
caught up and the session quiet, one more event is appended with no notice at all (one
refused while the channel was full): the server's resync (AERO_LIVE_RESYNC_SECONDS, 1 s
here) brings it anyway, once.

daphne is up when it answers HTTP at all: /healthz says 503 after the kill -9 test (the
killed workers' heartbeat rows are stale, no worker runs here), which is why this test's
daphne "did not start" when it ran after that test in CI."""

from __future__ import annotations

import re
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.faults.cluster import Cluster

# One xdist worker runs the whole fault suite, one test after another: they share one
# cluster (started once) and kill its processes on purpose.
pytestmark = [pytest.mark.services, pytest.mark.faults, pytest.mark.xdist_group("faults")]

SEQ = re.compile(r'<li id="event-(\d+)" data-seq="(\d+)"')
EVENTS = 300
CAPACITY = 2
RESYNC_SECONDS = 1
SMALL_LAYER = {
    "DJANGO_SETTINGS_MODULE": "tests.faults.small_layer_settings",
    "AERO_TEST_CHANNEL_CAPACITY": str(CAPACITY),
}


def read_rows(ws: ClientConnection, until: int, seconds: float) -> tuple[list[int], int, float]:
    """The seqs of the timeline rows received until seq `until`, then whatever else comes
    within 1.5 s (a duplicate would); the number of messages; when `until` arrived."""
    frames = 0
    seqs: list[int] = []
    deadline = time.monotonic() + seconds
    while not seqs or seqs[-1] < until:
        assert time.monotonic() < deadline, f"stuck at {seqs[-1:]} of {until}"
        message = ws.recv(timeout=max(0.1, deadline - time.monotonic()))
        assert isinstance(message, str)
        frames += 1
        for row_id, seq in SEQ.findall(message):
            assert row_id == seq
            seqs.append(int(seq))
    reached_at = time.time()
    try:
        while True:
            message = ws.recv(timeout=1.5)
            assert isinstance(message, str)
            frames += 1
            seqs += [int(seq) for _, seq in SEQ.findall(message)]
    except (TimeoutError, ConnectionClosed):
        pass
    return seqs, frames, reached_at


def test_slow_viewer_past_capacity_catches_up_without_gap_or_duplicate(cluster: Cluster) -> None:
    (session,) = cluster.driver("create", "1")  # no worker runs: only this test appends
    cookie: str = cluster.driver("login")
    # The live pages' resync at 1 s only in this daphne.
    live = {**SMALL_LAYER, "AERO_LIVE_RESYNC_SECONDS": str(RESYNC_SECONDS)}
    with cluster.daphne("daphne-slow-viewer", **live) as base:
        url = base.replace("http://", "ws://") + f"/ws/sessions/{session}/?lang=en&last_seq=0"
        # max_queue: the client buffers few messages, then stops reading the socket.
        with connect(
            url,
            open_timeout=10,
            max_queue=2,
            additional_headers={"Cookie": cookie, "Origin": base},
        ) as ws:
            # The slow viewer: reads nothing while the session grows past the capacity.
            started = time.monotonic()
            appended = cluster.driver("append", session, str(EVENTS), env=SMALL_LAYER)
            append_seconds = time.monotonic() - started
            time.sleep(2)  # still not reading: the last notices land too
            last: int = appended["last_seq"]

            seqs, frames, _ = read_rows(ws, last, 30)

            # Caught up and quiet: one more event whose notice is lost.
            quiet = cluster.driver("append", session, "1", "no-notices", env=SMALL_LAYER)
            late, _, reached_at = read_rows(ws, quiet["last_seq"], 10 * RESYNC_SECONDS)
            late_seconds = reached_at - quiet["committed_at"]

    expected = list(range(1, last + 1))
    seen = set(seqs)
    gaps = [s for s in expected if s not in seen]
    duplicates = len(seqs) - len(seen)
    print(
        f"\nFAULTS slow viewer (layer capacity {CAPACITY}): {appended['appended']} events "
        f"appended in {append_seconds:.1f} s with {appended['appended']} notices published, "
        f"{appended['dropped_at_publish']} dropped in Redis at publish (more in daphne's "
        f"receive buffer, not counted); viewer read nothing meanwhile, then received "
        f"{len(seqs)} rows in {frames} messages for seq 1..{last}: gaps {len(gaps)}, "
        f"duplicates {duplicates}; then one event with no notice: arrived once "
        f"{late_seconds:.1f} s after its commit (resync every {RESYNC_SECONDS} s)"
    )
    assert seqs == expected, f"gaps {gaps[:20]}, duplicates {duplicates}"
    assert late == [last + 1]
