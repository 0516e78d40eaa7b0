"""The live push for bench/perf_measure.py: viewers on WebSockets (our own client, in a
process of its own, as browsers are), events appended, commit -> message latency for every
(viewer, event) and the daphne processes' CPU per event."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _measure_inline import login_cookie, new_session, pct
from _measure_servers import daphnes, stop, wait_up

VIEWERS = r"""
import asyncio, json, re, sys, time
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

config = json.loads(sys.stdin.readline())  # thousands of URLs: over an argument's limit
failed = 0
settled = 0
# (viewer, arrival time, message): kept in memory and read after the run. A regex and a
# flushed print per message cost this process ~0.1 ms a message, on the cores daphne
# needs, and queued later messages behind them (browsers are other machines).
arrived = []

async def viewer(n, url):
    global failed, settled
    try:
        ws = await connect(url, additional_headers=config["headers"], open_timeout=60)
    except Exception:
        failed += 1
        return
    finally:
        settled += 1
    add = arrived.append
    clock = time.time
    async with ws:
        try:
            async for message in ws:
                add((n, clock(), message))
        except ConnectionClosed:  # closed with a code other than 1000/1001
            pass
    # The server closed it (a refused role, a gone session): it gets nothing more.
    session = url.split("/ws/sessions/")[1].split("/")[0]
    print(f"C {session} {ws.close_code}", flush=True)

def seqs(message):
    return re.findall(r'data-seq="(\d+)"', str(message))

async def main():
    tasks = [asyncio.ensure_future(viewer(n, url)) for n, url in enumerate(config["urls"])]
    # Every handshake answered (or refused), then a moment for the catch-up: a fixed
    # wait counted handshakes still under way on a loaded machine as open.
    deadline = time.monotonic() + config["settle"]
    while settled < len(tasks) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(1)
    print(f"READY {failed} {len(tasks) - settled}", flush=True)
    cpu = time.process_time()
    loop = asyncio.get_running_loop()
    # Told how many deliveries to wait for (after the events): counts them, off the
    # receiving path, then prints them all.
    told = await loop.run_in_executor(None, sys.stdin.readline)
    expected, timeout = (float(x) for x in told.split())
    found, read = 0, 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = arrived[read:]
        read += len(batch)
        found += sum(len(seqs(m)) for _, _, m in batch)
        if found >= expected:
            break
        await asyncio.sleep(0.2)
    cpu = (time.process_time() - cpu) * 1000
    sessions = [url.split("/ws/sessions/")[1].split("/")[0] for url in config["urls"]]
    for n, at, message in arrived:
        for seq in seqs(message):
            print(f"M {n} {sessions[n]} {seq} {at}")
    print(f"END {len(arrived)} {cpu}", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)  # until closed
    for task in tasks:
        task.cancel()

asyncio.run(main())
"""


def live_push(
    viewers: int,
    sessions: int,
    events: int,
    port: int,
    logs: Path,
    processes: int = 1,
    clients: int = 1,
) -> dict[str, Any]:
    """`viewers` sockets spread over `sessions` sessions and over `processes` daphne
    processes sharing one listening socket, as under `make run` (the kernel spreads the
    viewers over them), opened by `clients` client processes (round robin); `events`
    rounds of one event per session, appended one after another, 0.5 s between rounds;
    commit -> message latency for every (viewer, event). Each process's listening port
    of its own (as here before) made the page's Origin another origin for all but the
    first: every viewer of the others was refused (half the handshakes at 2 processes)."""
    from urllib.parse import quote

    from diagnosis.events import append_event
    from diagnosis.presenters import composer_key

    servers = daphnes(processes, port, logs)
    base = f"http://127.0.0.1:{port}"
    clients = max(1, min(clients, viewers))
    started_clients: list[subprocess.Popen[str]] = []
    try:
        wait_up(base)
        # wait_up reached one of them: every one listening before the viewers come, so
        # they spread over all (a process still starting accepts none).
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not all(
            "Listening on" in (logs / f"daphne{port}-{n}.log").read_text() for n in range(processes)
        ):
            time.sleep(0.3)
        targets = [new_session_no_job() for _ in range(sessions)]
        # The URL the session page opens: with the answer box it shows and its language.
        # Without `composer` the first push re-sent every viewer the answer box, with its
        # panel's reads (~18 ms a session), which the page never asks for.
        urls = [
            f"ws://127.0.0.1:{port}/ws/sessions/{targets[n % sessions].pk}/"
            f"?last_seq={targets[n % sessions].last_seq}"
            f"&composer={quote(composer_key(targets[n % sessions]))}&lang=en"
            for n in range(viewers)
        ]
        headers = {"Cookie": login_cookie("auditor"), "Origin": base}
        opening = time.monotonic()
        for c in range(clients):
            config = {
                "urls": urls[c::clients],
                "headers": headers,
                # The longest wait for the handshakes (the client goes on once all answered).
                "settle": 60 + viewers / 10,
            }
            client = subprocess.Popen(
                [sys.executable, "-c", VIEWERS],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            started_clients.append(client)
            assert client.stdin is not None
            client.stdin.write(json.dumps(config) + "\n")
            client.stdin.flush()
        closed: list[str] = []
        failed = [0] * clients
        unanswered = [0] * clients
        closed_in = [0] * clients
        for c, client in enumerate(started_clients):
            assert client.stdout is not None
            for line in client.stdout:
                if line.startswith("READY"):
                    failed[c], unanswered[c] = (int(n) for n in line.split()[1:3])
                    break
                if line.startswith("C "):
                    closed.append(line.split()[2])
                    closed_in[c] += 1
        # The clients' start included; less their second for the catch-up pulls.
        handshakes_s = time.monotonic() - opening - 1
        settle_cpu(servers)
        committed: dict[tuple[str, int], float] = {}
        cpu_before = sum(process_cpu_ms(server.pid) for server in servers)
        for round_ in range(events):
            for session in targets:
                # From before the append (its commit and notice inside): an upper bound.
                started = time.time()
                event = append_event(session.pk, "agent.note", {"text": f"r{round_}"}, producer="b")
                committed[(str(session.pk), event.seq)] = started
            time.sleep(0.5)
        # (client, viewer, session, seq, arrival)
        received: list[tuple[int, int, str, int, float]] = []
        for c, client in enumerate(started_clients):
            assert client.stdin is not None
            open_here = len(urls[c::clients]) - failed[c] - unanswered[c] - closed_in[c]
            client.stdin.write(f"{open_here * events} 60\n")
            client.stdin.flush()
        # Each client's CPU from before the first event until it had all its deliveries
        # (its count of them included, not the printing after).
        clients_cpu_ms = 0.0
        for c, client in enumerate(started_clients):
            assert client.stdout is not None
            for line in client.stdout:
                p = line.split()
                if p and p[0] == "M":
                    received.append((c, int(p[1]), p[2], int(p[3]), float(p[4])))
                elif p and p[0] == "C":
                    closed.append(p[2])
                elif p and p[0] == "END":
                    clients_cpu_ms += float(p[2])
                    break
        server_cpu_ms = sum(process_cpu_ms(server.pid) for server in servers) - cpu_before
    finally:
        for client in started_clients:
            if client.stdin is not None and not client.stdin.closed:
                client.stdin.close()
            try:
                client.wait(timeout=30)
            except subprocess.TimeoutExpired:
                client.kill()
        stop(servers)
    latencies = [
        (at - committed[(s, q)]) * 1000 for _, _, s, q, at in received if (s, q) in committed
    ]
    # A viewer given an event twice (never expected: a pull only advances over what it sent).
    repeated = len(received) - len({(c, n, s, q) for c, n, s, q, _ in received})
    return {
        "push_viewers": viewers,
        "push_sessions": sessions,
        "push_processes": processes,
        "push_clients": clients,
        "push_p50_ms": pct(latencies, 0.5),
        "push_p99_ms": pct(latencies, 0.99),
        "push_received": len(latencies),
        "push_repeated": repeated,
        "push_expected": viewers * events,
        "push_failed_handshakes": sum(failed),
        # Handshakes still unanswered when the events began, and sockets the server closed
        # (with their codes: 4403 refused, 4404 gone): neither is expected to receive.
        "push_unanswered_handshakes": sum(unanswered),
        # From the clients' start to every handshake answered: a burst is answered
        # together, so this is what daphne's handshake timeout must exceed.
        "push_handshakes_s": handshakes_s,
        "push_closed": len(closed),
        "push_close_codes": sorted(set(closed)),
        # The servers' CPU per event delivered to all its viewers: unlike the latencies,
        # it hardly depends on what else the machine runs.
        "push_cpu_ms_per_event": server_cpu_ms / max(1, events * sessions),
        # The client processes' CPU per event (all its viewers): what the bench's own
        # client took from the cores daphne shares.
        "push_client_cpu_ms_per_event": clients_cpu_ms / max(1, events * sessions),
    }


def settle_cpu(servers: list[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    """Wait (at most `timeout`) until the servers are idle: each daphne warms up its
    model clients' imports on a thread at start (seconds of CPU), which counted in the
    CPU per event when the events came before it had finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = sum(process_cpu_ms(server.pid) for server in servers)
        time.sleep(1)
        if sum(process_cpu_ms(server.pid) for server in servers) - before < 50:
            return


def process_cpu_ms(pid: int) -> float:
    """User + system CPU of a process so far (Linux /proc), in ms."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def new_session_no_job() -> Any:
    """A session with a few events, no job (the push bench appends its own)."""
    import diagnosis.actions as actions

    original = actions.enqueue_advance
    actions.enqueue_advance = lambda session_id: None  # type: ignore[assignment]
    try:
        session = new_session()
    finally:
        actions.enqueue_advance = original  # type: ignore[assignment]
    session.refresh_from_db()
    return session
