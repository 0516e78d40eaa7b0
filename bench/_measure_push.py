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
import base64, json, os, re, select, socket, sys, time
from urllib.parse import urlsplit

# Browsers are other machines; this client shares daphne's 2 cores, so it is lean: raw
# sockets on one epoll, the handshake written by hand, and a minimal parser for the
# server's (unmasked) frames, with a fast path for a read holding one whole small frame.
# The arrival time is taken at each read; every message is kept as (viewer, time, bytes)
# and searched for its seqs after the run (the websockets library cost ~45 us a message,
# a regex and a print per message ~0.1 ms, on the cores daphne needs).
config = json.loads(sys.stdin.readline())  # thousands of URLs: over an argument's limit
urls = config["urls"]
sessions = [url.split("/ws/sessions/")[1].split("/")[0] for url in urls]
OPEN_TIMEOUT = 60
failed = 0
settled = 0
arrived = []
add = arrived.append
clock = time.time
poller = select.epoll()
by_fd = {}  # socket's fd -> its viewer
READ, WRITE = select.EPOLLIN, select.EPOLLOUT
STDIN = sys.stdin.fileno()


class Viewer:
    __slots__ = ("n", "sock", "open", "buf", "parts", "started", "request")

    def __init__(self, n, sock, request):
        self.n, self.sock, self.open, self.request = n, sock, False, request
        self.buf, self.parts, self.started = bytearray(), [], time.monotonic()


def request(url):
    parts = urlsplit(url)
    headers = [
        f"GET {parts.path}?{parts.query} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}",
        "Sec-WebSocket-Version: 13",
        *(f"{k}: {v}" for k, v in config["headers"].items()),
    ]
    return ("\r\n".join(headers) + "\r\n\r\n").encode(), (parts.hostname, parts.port)


def masked(opcode, payload):
    # A client's frames must be masked (a pong, the close reply); a zero mask will do.
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + bytes(4) + payload


def close(viewer, code):
    global failed, settled
    if by_fd.pop(viewer.sock.fileno(), None) is not None:
        poller.unregister(viewer.sock.fileno())
    viewer.sock.close()
    if viewer.open:
        # The server closed it (a refused role, a gone session): it gets nothing more.
        print(f"C {sessions[viewer.n]} {code}", flush=True)
    else:
        failed += 1
        settled += 1


def frames(viewer, at):
    buf = viewer.buf
    pos, size = 0, len(buf)
    while size - pos >= 2:
        b0, b1 = buf[pos], buf[pos + 1]
        length, head = b1 & 0x7F, 2
        if length == 126:
            if size - pos < 4:
                break
            length, head = int.from_bytes(buf[pos + 2 : pos + 4]), 4
        elif length == 127:
            if size - pos < 10:
                break
            length, head = int.from_bytes(buf[pos + 2 : pos + 10]), 10
        if b1 & 0x80:
            head += 4  # never from a server; skipped rather than unmasked
        if size - pos < head + length:
            break
        payload = bytes(buf[pos + head : pos + head + length])
        pos += head + length
        opcode = b0 & 0x0F
        if opcode in (0, 1, 2):
            viewer.parts.append(payload)
            if b0 & 0x80:
                add((viewer.n, at, b"".join(viewer.parts)))
                viewer.parts = []
        elif opcode == 9:
            viewer.sock.sendall(masked(10, payload))
        elif opcode == 8:
            code = int.from_bytes(payload[:2]) if len(payload) >= 2 else 1005
            try:
                viewer.sock.sendall(masked(8, payload[:2]))
            except OSError:
                pass
            del buf[:pos]
            close(viewer, code)
            return
    del buf[:pos]


def readable(viewer):
    global settled
    try:
        data = viewer.sock.recv(262144)
    except (BlockingIOError, InterruptedError):
        return
    except OSError:
        data = b""
    at = clock()
    if not data:
        close(viewer, 1006)
        return
    # The usual read: one whole unfragmented text frame under 64 KB, nothing buffered.
    if viewer.open and not viewer.buf and data[0] == 0x81:
        length = data[1]
        if length < 126:
            if len(data) == 2 + length:
                add((viewer.n, at, data[2:]))
                return
        elif length == 126 and len(data) == 4 + int.from_bytes(data[2:4]):
            add((viewer.n, at, data[4:]))
            return
    viewer.buf += data
    if not viewer.open:
        end = viewer.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        status = bytes(viewer.buf[: viewer.buf.find(b"\r\n")]).split()
        if len(status) < 2 or status[1] != b"101":
            close(viewer, 0)
            return
        del viewer.buf[: end + 4]
        viewer.open = True
        settled += 1
    frames(viewer, at)


# At most this many handshakes under way: 10,000 connects in one loop overflowed the
# listen backlog (1,024), and the dropped SYNs' retries (after 1, 3, 7, 15, 31 s) pushed
# thousands of handshakes past the 60 s timeout.
IN_FLIGHT = 500
viewers = []


def start_more():
    while len(viewers) < len(urls) and len(viewers) - settled < IN_FLIGHT:
        data, address = request(urls[len(viewers)])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        sock.connect_ex(address)
        viewer = Viewer(len(viewers), sock, data)
        viewers.append(viewer)
        by_fd[sock.fileno()] = viewer
        poller.register(sock.fileno(), WRITE)


def turn(timeout):
    for fd, events in poller.poll(timeout):
        viewer = by_fd.get(fd)
        if viewer is None:
            if fd == STDIN:
                return sys.stdin.readline()
            continue
        if events & READ or viewer.open:
            readable(viewer)
        elif events & WRITE:
            try:
                viewer.sock.send(viewer.request)  # a few hundred bytes: one send
            except OSError:
                close(viewer, 0)
                continue
            poller.modify(fd, READ)
        else:
            close(viewer, 0)  # an error before the handshake was sent
    return None


# Every handshake answered (or refused), then a moment for the catch-up: a fixed wait
# counted handshakes still under way on a loaded machine as open.
deadline = time.monotonic() + config["settle"]
checked = time.monotonic()
while settled < len(urls) and time.monotonic() < deadline:
    start_more()
    turn(0.1)
    if time.monotonic() - checked >= 1:  # handshakes unanswered for too long: failed
        checked = time.monotonic()
        for viewer in viewers:
            if not viewer.open and viewer.sock.fileno() >= 0:
                if checked - viewer.started > OPEN_TIMEOUT:
                    close(viewer, 0)
end = time.monotonic() + 1
while time.monotonic() < end:
    turn(0.1)
print(f"READY {failed} {len(urls) - settled}", flush=True)
cpu = time.process_time()
# Told how many deliveries to wait for (after the events): counts them every 0.2 s,
# off the receiving path, then prints them all.
poller.register(STDIN, READ)
told = None
while told is None:
    told = turn(-1)
expected, timeout = (float(x) for x in told.split())
seq = re.compile(rb'data-seq="(\d+)"')
found, read = 0, 0
deadline = time.monotonic() + timeout
checked = time.monotonic()
while time.monotonic() < deadline:
    turn(0.2)
    if time.monotonic() - checked >= 0.2:
        checked = time.monotonic()
        batch = arrived[read:]
        read += len(batch)
        # Counted by their marker (exactly the seqs printed below, which the regex finds).
        found += sum(m.count(b'data-seq="') for _, _, m in batch)
        if found >= expected:
            break
cpu = (time.process_time() - cpu) * 1000
out = []
for n, at, message in arrived:
    for s in seq.findall(message):
        out.append(f"M {n} {sessions[n]} {int(s)} {at}\n")
sys.stdout.write("".join(out))
print(f"END {len(arrived)} {cpu}", flush=True)
sys.stdin.read()  # until closed
"""


def live_push(
    viewers: int,
    sessions: int,
    events: int,
    port: int,
    logs: Path,
    processes: int = 1,
    clients: int = 1,
    rate: float = 0,
) -> dict[str, Any]:
    """`viewers` sockets spread over `sessions` sessions and over `processes` daphne
    processes sharing one listening socket, as under `make run` (the kernel spreads the
    viewers over them), opened by `clients` client processes (round robin); `events`
    rounds of one event per session, appended one after another (back to back, or `rate`
    events a second spread evenly over the round), 0.5 s between rounds; commit -> message
    latency for every (viewer, event). Each process's listening port
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
        rounds_s: list[float] = []
        for round_ in range(events):
            round_start = time.monotonic()
            for n, session in enumerate(targets):
                if rate > 0:  # paced: the n-th event of a round at n / rate seconds
                    time.sleep(max(0.0, round_start + n / rate - time.monotonic()))
                # From before the append (its commit and notice inside): an upper bound.
                started = time.time()
                event = append_event(session.pk, "agent.note", {"text": f"r{round_}"}, producer="b")
                committed[(str(session.pk), event.seq)] = started
            rounds_s.append(time.monotonic() - round_start)
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
        # How fast the events were committed: a round's events over its seconds (at many
        # sessions a round back to back is a burst the daphnes may not keep up with).
        "push_rate_asked": rate,
        "push_events_per_s": events * sessions / max(1e-9, sum(rounds_s)),
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
