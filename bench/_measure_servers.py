"""Server and worker processes for bench/perf_measure.py: rq workers, daphne, gunicorn,
uvicorn; the worker figures (create -> first wait, sessions at once, diagnoses at once)
and pages under concurrent clients."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _measure_inline import big_session, login_cookie, new_session, pct, user


def start(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        env={**os.environ, **env},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()


def workers(count: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    return [
        start(
            [sys.executable, "manage.py", "aero_worker"],
            logs / f"worker{n}.log",
            AERO_JOB_BACKEND="rq",
            AERO_RECONCILE_SECONDS="5",
        )
        for n in range(count)
    ]


def wait_statuses(ids: list[Any], timeout: float) -> dict[Any, float]:
    from diagnosis.models import Session

    done: dict[Any, float] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(ids) and time.monotonic() < deadline:
        rows = Session.objects.filter(pk__in=[i for i in ids if i not in done])
        for pk in rows.filter(status__in=["waiting_user", "completed", "failed"]).values_list(
            "pk", flat=True
        ):
            done[pk] = time.monotonic()
        time.sleep(0.005)
    return done


def rq_latency(samples: int, logs: Path) -> dict[str, Any]:
    procs = workers(1, logs)
    try:
        time.sleep(3)  # the worker imports langgraph and connects
        new_wait = wait_statuses([new_session().pk], 60)  # warm up
        assert new_wait, "the worker did not run the warm-up session"
        latencies = []
        for _ in range(samples):
            started = time.monotonic()
            session = new_session()
            done = wait_statuses([session.pk], 60)
            latencies.append((done.get(session.pk, float("inf")) - started) * 1000)
    finally:
        stop(procs)
    return {"rq_p50_ms": pct(latencies, 0.5), "rq_p95_ms": pct(latencies, 0.95)}


def at_once(count: int, timeout: float, logs: Path) -> dict[str, Any]:
    import django_rq
    from django.conf import settings

    from diagnosis.models import AgentRun

    connection = django_rq.get_queue(settings.AERO_QUEUE).connection
    before = len(list(connection.scan_iter("rq:job:*", count=1000)))
    procs = workers(2, logs)
    try:
        time.sleep(3)
        started = time.monotonic()
        ids = [new_session().pk for _ in range(count)]
        done = wait_statuses(ids, timeout)
        elapsed = (max(done.values()) - started) if len(done) == count else float("inf")
        jobs = len(list(connection.scan_iter("rq:job:*", count=1000))) - before
        runs = AgentRun.objects.filter(session_id__in=ids, parent__isnull=True).count()
        # Jobs the workers ran (a duplicate that found the lease taken counts too): one
        # per session when each was enqueued once. Read before the workers exit.
        from rq import Worker

        queue = django_rq.get_queue(settings.AERO_QUEUE)
        executed = sum(w.successful_job_count + w.failed_job_count for w in Worker.all(queue=queue))
    finally:
        stop(procs)
    return {
        "at_once_sessions": count,
        "at_once_done": len(done),
        "at_once_s": elapsed,
        "at_once_jobs": jobs,
        "at_once_runs": runs,
        "at_once_executed": executed,
    }


def diagnoses_at_once(count: int, timeout: float, logs: Path) -> dict[str, Any]:
    """Issue 31's load: `count` diagnoses of the three example bundles submitted at once,
    on 2 workers, until each has concluded (its fix waiting for approval, or done)."""
    from diagnosis.models import Session
    from packs.diagnosis.sessions import start_from_bundle

    examples = sorted((Path.cwd() / "packs/diagnosis/data/examples").glob("ex-*.tar.gz"))
    procs = workers(2, logs)
    try:
        time.sleep(3)
        started = time.monotonic()
        operator = user("operator")
        ids = [
            start_from_bundle(operator, examples[n % len(examples)], {}).pk for n in range(count)
        ]
        done = wait_statuses(ids, timeout)
        elapsed = (max(done.values()) - started) if len(done) == count else float("inf")
    finally:
        stop(procs)
    concluded = sum(
        1
        for snapshot in Session.objects.filter(pk__in=ids).values_list("snapshot", flat=True)
        if (snapshot or {}).get("root_cause")
    )
    return {"diag_at_once_s": elapsed, "diag_at_once_done": len(done), "diag_concluded": concluded}


def only_workers_missing(body: bytes) -> bool:
    """/healthz fails while no worker beats (correct in production). The bench stops its
    workers between phases, and one stopped may leave its row behind until it is swept,
    so a server whose only failed checks are the workers' is up for the phases that need
    none (push, pages)."""
    try:
        checks = json.loads(body)["checks"]
    except (ValueError, KeyError, TypeError):
        return False
    failed = {name for name, value in checks.items() if str(value).startswith("failed")}
    return bool(failed) and failed <= {"workers", "llm_runner"}


def wait_up(url: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            host, port = url.split("//")[1].split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            if response.status == 200 or only_workers_missing(response.read()):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up")


def daphne(port: int, logs: Path) -> subprocess.Popen[bytes]:
    return start(
        [str(Path(sys.executable).parent / "daphne"), "-e",
         f"tcp:port={port}:interface=127.0.0.1:backlog=1024", "aero.asgi:application"],
        logs / f"daphne{port}.log",
        AERO_JOB_BACKEND="rq",
    )  # fmt: skip


def daphnes(count: int, port: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    """`count` daphne processes on one listening socket, as `make run` serves the
    WebSockets (scripts/run.sh: supervisord opens it and hands it to each as fd 0, with
    the same flags): the kernel spreads the clients over them, all on one port, so the
    page's Origin is the same for all."""
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1024)
    try:
        command = [str(Path(sys.executable).parent / "daphne"), "--fd", "0",
                   "--websocket_connect_timeout", "60", "aero.asgi:application"]  # fmt: skip
        return [
            subprocess.Popen(
                command,
                env={**os.environ, "AERO_JOB_BACKEND": "rq"},
                stdin=listener.fileno(),
                stdout=(logs / f"daphne{port}-{n}.log").open("w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for n in range(count)
        ]
    finally:
        listener.close()  # the processes hold it


def gunicorn(port: int, logs: Path) -> subprocess.Popen[bytes]:
    return start(
        [str(Path(sys.executable).parent / "gunicorn"), "aero.wsgi:application", "--bind",
         f"127.0.0.1:{port}", "--worker-class", "gthread", "--workers", "3", "--threads", "4",
         "--backlog", "1024"],
        logs / f"gunicorn{port}.log",
        AERO_JOB_BACKEND="rq",
    )  # fmt: skip


def uvicorn(port: int, logs: Path) -> subprocess.Popen[bytes]:
    return start(
        [str(Path(sys.executable).parent / "uvicorn"), "aero.asgi:application", "--host",
         "127.0.0.1", "--port", str(port), "--workers", "3", "--backlog", "1024",
         "--no-access-log"],
        logs / f"uvicorn{port}.log",
        AERO_JOB_BACKEND="rq",
    )  # fmt: skip


# The viewers run in a process of their own (as browsers do): in the appending process
# they would wait for its GIL, and the appends' own time would count as push latency.


def throughput(base: str, path: str, cookie: str, clients: int, seconds: float) -> float:
    host, port = base.split("//")[1].split(":")
    count = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client() -> None:
        nonlocal count
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        while time.monotonic() < stop_at:
            try:
                conn.request("GET", path, headers={"Cookie": cookie})
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                continue
            if ok:
                with lock:
                    count += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return count / (time.monotonic() - started)


def concurrent_pages(clients: int, seconds: float, port: int, logs: Path, head: bool) -> dict:
    session = big_session(200)
    cookie = login_cookie("operator")
    path = f"/sessions/{session.pk}/"
    results = {}
    # The tree's own way of serving HTTP (base: daphne; this change: gunicorn beside
    # daphne), then the same views under plain gunicorn for reference.
    # With this change, also the alternatives for the record: daphne alone and
    # uvicorn's ASGI workers (when installed), three processes as gunicorn has.
    servers: list[tuple[str, Callable[[int, Path], subprocess.Popen[bytes]]]] = [
        ("served", gunicorn if head else daphne),
        ("gunicorn", gunicorn),
    ]
    if head:
        servers.append(("daphne", daphne))
        if (Path(sys.executable).parent / "uvicorn").exists():
            servers.append(("uvicorn", uvicorn))
    for name, server in servers:
        process = server(port, logs)
        try:
            wait_up(f"http://127.0.0.1:{port}")
            throughput(f"http://127.0.0.1:{port}", path, cookie, 2, 1.0)  # warm up
            results[f"pages_{name}_rps"] = throughput(
                f"http://127.0.0.1:{port}", path, cookie, clients, seconds
            )
        finally:
            stop([process])
        port += 1
    return results
