"""The dependency audit in CI (issue 7, item 7): scripts/audit_deps.py fails on a known
vulnerability and never passes off an unaudited dependency as clean. pip-audit itself is
replaced by a stub that answers like it (its services are not reachable from tests)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLEAN = {"name": "django", "version": "6.1.3", "vulns": []}
VULNERABLE = {
    "name": "urllib3",
    "version": "1.26.4",
    "vulns": [{"id": "PYSEC-2023-212", "fix_versions": ["1.26.18", "2.0.7"], "aliases": []}],
}
SKIPPED = {"name": "txaio", "skip_reason": "Dependency not found on PyPI and could not be audited"}
EDITABLE = {"name": "aero", "skip_reason": "distribution marked as editable"}


def audit(tmp_path: Path, dependencies: list[dict[str, Any]], **env: str) -> Any:
    stub = tmp_path / "pip-audit"
    report = json.dumps({"dependencies": dependencies, "fixes": []})
    stub.write_text(f"#!/bin/sh\necho {json.dumps(report)!s}\n")
    stub.chmod(0o755)
    environment = {
        **os.environ,
        "PIP_AUDIT": str(stub),
        "AERO_AUDIT_STRICT": "0",
        "AERO_AUDIT_PYPI_URL": "http://127.0.0.1:9/pypi",  # nothing listens: tests say
        **env,
    }
    return subprocess.run(
        [sys.executable, "scripts/audit_deps.py"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_known_vulnerability_fails_the_audit(tmp_path: Path) -> None:
    run = audit(tmp_path, [EDITABLE, CLEAN, VULNERABLE])
    assert run.returncode == 1
    assert "VULNERABLE urllib3 1.26.4: PYSEC-2023-212 (fixed in 1.26.18, 2.0.7)" in run.stdout
    assert "2 of 2 dependencies audited, 1 with known vulnerabilities" in run.stdout


def test_clean_dependencies_pass(tmp_path: Path) -> None:
    run = audit(tmp_path, [EDITABLE, CLEAN])
    assert run.returncode == 0 and "NOT AUDITED" not in run.stdout


@pytest.mark.parametrize(("strict", "code"), [("0", 0), ("1", 2)])
def test_unaudited_dependencies_are_reported_never_called_clean(
    tmp_path: Path, strict: str, code: int
) -> None:
    run = audit(tmp_path, [EDITABLE, CLEAN, SKIPPED], AERO_AUDIT_STRICT=strict)
    assert run.returncode == code
    assert "1 of 2 dependencies audited" in run.stdout
    assert "NOT AUDITED: 1 dependencies" in run.stdout and "txaio" in run.stdout


# --- PyPI's project JSON, where pip-audit's per-version service is missing ----------------

TXAIO = importlib.metadata.version("txaio")  # SKIPPED names an installed distribution


@pytest.fixture
def pypi() -> Iterator[tuple[str, dict[str, Any]]]:
    """A PyPI answering only the project JSON (as the mirror here does): /pypi/<name>/json
    from `projects`, 404 for anything else."""
    projects: dict[str, Any] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            found = projects.get(parts[1]) if len(parts) == 3 and parts[2] == "json" else None
            body = json.dumps(found).encode()
            self.send_response(200 if found else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/pypi", projects
    server.shutdown()


def project(latest: str, *vulns: dict[str, Any]) -> dict[str, Any]:
    return {"info": {"name": "txaio", "version": latest}, "vulnerabilities": list(vulns)}


ADVISORY = {"id": "GHSA-xxxx-yyyy-zzzz", "fixed_in": ["99.0"], "withdrawn": None}


def test_a_skipped_dependency_at_its_latest_release_is_audited_from_the_project_json(
    tmp_path: Path, pypi: tuple[str, dict[str, Any]]
) -> None:
    url, projects = pypi
    projects["txaio"] = project(TXAIO, ADVISORY, {**ADVISORY, "id": "OLD", "withdrawn": "2024"})
    run = audit(tmp_path, [EDITABLE, CLEAN, SKIPPED], AERO_AUDIT_PYPI_URL=url)
    assert run.returncode == 1
    assert f"VULNERABLE txaio {TXAIO}: GHSA-xxxx-yyyy-zzzz (fixed in 99.0)" in run.stdout
    assert "OLD" not in run.stdout  # a withdrawn advisory is no vulnerability
    assert "2 of 2 dependencies audited, 1 with known vulnerabilities" in run.stdout

    projects["txaio"] = project(TXAIO)
    run = audit(tmp_path, [EDITABLE, CLEAN, SKIPPED], AERO_AUDIT_PYPI_URL=url)
    assert run.returncode == 0, run.stdout
    assert "NOT AUDITED" not in run.stdout
    assert "PyPI project JSON: 1 dependencies pip-audit skipped audited there." in run.stdout


@pytest.mark.parametrize(("strict", "code"), [("0", 0), ("1", 2)])
def test_an_older_release_or_no_answer_stays_not_audited(
    tmp_path: Path, pypi: tuple[str, dict[str, Any]], strict: str, code: int
) -> None:
    url, projects = pypi
    # The latest release's advisories say nothing about an older one.
    projects["txaio"] = project("9999.0", ADVISORY)
    run = audit(tmp_path, [CLEAN, SKIPPED], AERO_AUDIT_PYPI_URL=url, AERO_AUDIT_STRICT=strict)
    assert run.returncode == code
    assert f"{TXAIO} is not the latest release (9999.0)" in run.stdout
    assert "VULNERABLE" not in run.stdout and "1 of 2 dependencies audited" in run.stdout

    del projects["txaio"]  # 404
    run = audit(tmp_path, [CLEAN, SKIPPED], AERO_AUDIT_PYPI_URL=url, AERO_AUDIT_STRICT=strict)
    assert run.returncode == code
    assert "the project JSON failed too (HTTPError)" in run.stdout
