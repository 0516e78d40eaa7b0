"""Debian's Prometheus (scripts/install-system-deps.sh) started by a test on a free port
with its own data dir, loaded with an example bundle's metrics.csv through
`promtool tsdb create-blocks-from openmetrics`; and fake servers that answer badly."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb
import pytest

from tests.servers import free_port


def openmetrics(metrics_csv: Path, out: Path) -> int:
    """metrics.csv as OpenMetrics text (each metric's samples together, as the format
    asks); how many samples it holds."""
    con = duckdb.connect()
    try:
        rows = con.execute(
            "SELECT metric, service, epoch_ms(ts), value FROM read_csv(?, header=true, "
            "columns={'ts': 'TIMESTAMPTZ', 'service': 'VARCHAR', 'metric': 'VARCHAR', "
            "'value': 'DOUBLE'}) ORDER BY metric, service, ts",
            [str(metrics_csv)],
        ).fetchall()
    finally:
        con.close()
    lines: list[str] = []
    family = None
    for metric, service, ms, value in rows:
        if metric != family:
            lines.append(f"# TYPE {metric} gauge")
            family = metric
        lines.append(f'{metric}{{service="{service}"}} {value!r} {ms / 1000:.3f}')
    lines.append("# EOF")
    out.write_text("\n".join(lines) + "\n")
    return len(rows)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def prometheus_with(metrics_csv: Path, workdir: Path) -> Iterator[str]:
    """A Prometheus holding `metrics_csv`'s samples; its base URL."""
    binary, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if binary is None or promtool is None:
        pytest.fail("Prometheus is not installed (scripts/install-system-deps.sh)")
    data = workdir / "data"
    data.mkdir(parents=True)
    text = workdir / "metrics.om"
    openmetrics(metrics_csv, text)
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(data)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    config = workdir / "prometheus.yml"
    config.write_text("global: {}\n")  # nothing to scrape: the blocks are the data
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = workdir / "prometheus.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                # The examples' samples are weeks old: kept, not expired at start.
                "--storage.tsdb.retention.time=100y",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while not _ready(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"Prometheus did not start:\n{log.read_text()}")
                time.sleep(0.3)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=20)


@contextmanager
def fake_server(
    status: int, body: bytes, delay: float = 0.0, seen: list[dict[str, str]] | None = None
) -> Iterator[str]:
    """An HTTP server answering every GET with `status` and `body` after `delay` s; each
    request's path and headers go into `seen`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if seen is not None:
                seen.append({"path": self.path, **dict(self.headers.items())})
            time.sleep(delay)
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:  # the client gave up waiting
                pass

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
