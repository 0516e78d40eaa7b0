"""What supervisord runs, read over its unix socket (`make run`: scripts/run.sh exports
AERO_SUPERVISOR_SOCKET). /healthz reports every configured process from it: the set of
processes is the supervisor's configuration, not whatever happens to have beaten lately."""

from __future__ import annotations

import http.client
import os
import socket
import xmlrpc.client
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

SOCKET_ENV = "AERO_SUPERVISOR_SOCKET"


@dataclass(frozen=True)
class Process:
    name: str  # worker-1, llmrunner, daphne, gunicorn, ...
    group: str  # the program (worker for worker-1)
    state: str  # RUNNING, STARTING, BACKOFF, EXITED, FATAL, ...
    pid: int  # 0 when not running


def socket_path() -> str | None:
    return os.environ.get(SOCKET_ENV) or None


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    """XML-RPC over a unix socket with a timeout (supervisor's own transport has none:
    a stuck supervisord would hang /healthz)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__()
        self.unix_path, self.timeout = path, timeout

    def make_connection(self, host: object) -> http.client.HTTPConnection:
        return _UnixConnection(self.unix_path, self.timeout)


def processes(path: str, timeout: float = 2.0) -> list[Process]:
    """supervisor.getAllProcessInfo over the socket. Raises OSError (or an XML-RPC
    fault) when supervisord does not answer: the caller reports that as a failure."""
    # The host part is ignored: the transport connects to the unix socket.
    proxy = xmlrpc.client.ServerProxy("http://localhost", transport=_UnixTransport(path, timeout))
    infos = proxy.supervisor.getAllProcessInfo()
    assert isinstance(infos, list)
    return [
        Process(
            name=str(info["name"]),
            group=str(info["group"]),
            state=str(info["statename"]),
            pid=int(info["pid"]),
        )
        for info in infos
    ]


def down(found: list[Process], serving: Collection[int] = ()) -> list[str]:
    """The processes that do not run now, each with its state ("daphne: starting"). One
    killed a moment ago is still RUNNING to supervisord until it reaps it: its pid
    says so first. A STARTING process whose pid is in `serving` (the web server
    answering this very request) is up: supervisord only waits out its startsecs,
    which stay long so that a server crashing while it loads the app still ends FATAL."""
    return [
        f"{p.name}: {p.state.lower()}" if p.state != "RUNNING" else f"{p.name}: gone (pid {p.pid})"
        for p in found
        if not (p.state == "RUNNING" or (p.state == "STARTING" and p.pid in serving))
        or process_gone(p.pid)
    ]


def process_gone(pid: int) -> bool:
    """Whether no process `pid` runs on this host (a zombie counts as gone: killed and
    not yet reaped by its parent). Unsure (not ours to signal) reads as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
