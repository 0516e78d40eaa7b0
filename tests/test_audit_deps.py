"""The dependency audit in CI (issue 7, item 7): scripts/audit_deps.py fails on a known
vulnerability and never passes off an unaudited dependency as clean. pip-audit itself is
replaced by a stub that answers like it (its services are not reachable from tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    environment = {**os.environ, "PIP_AUDIT": str(stub), "AERO_AUDIT_STRICT": "0", **env}
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
