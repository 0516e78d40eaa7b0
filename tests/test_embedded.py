"""The embedded default (no DATABASE_URL, no REDIS_URL): SQLite, in-process jobs, offline
provider. The README's start command prepares this; the CLI then works on it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.servers import run_embedded


def manage(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_embedded(tmp_path, "manage.py", *args)


@pytest.mark.long
def test_cli_on_the_embedded_default(tmp_path: Path) -> None:
    unmigrated = manage(tmp_path, "incident", "run", "--scenario", "oil_spill", "--message", "x")
    assert unmigrated.returncode != 0
    assert "not migrated" in unmigrated.stderr
    assert len(unmigrated.stderr.strip().splitlines()) == 1

    for step in (("migrate", "--noinput", "-v0"), ("load_builtin",), ("seed_demo",)):
        result = manage(tmp_path, *step)
        assert result.returncode == 0, result.stderr
    assert "operator-demo-pass" in result.stdout
    assert (tmp_path / "aero.sqlite3").exists()

    run = manage(
        tmp_path,
        "incident",
        "run",
        "--scenario",
        "oil_spill",
        "--message",
        "MU5678 stand 101 hydraulic leak, engines off, no longer leaking, about 2 m2",
        "--decide",
        "approve",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    result_json = json.loads(run.stdout)
    assert result_json["status"] == "completed"
    assert result_json["risk"] == {"rule": "OS-12", "level": "LOW", "score": 25}
    assert result_json["impact"]["isolated_nodes"] == ["101", "A1"]
    assert (tmp_path / "checkpoints.sqlite3").exists()

    unknown = manage(tmp_path, "incident", "run", "--scenario", "nope", "--message", "x")
    assert unknown.returncode != 0
    assert "unknown scenario 'nope'" in unknown.stderr
