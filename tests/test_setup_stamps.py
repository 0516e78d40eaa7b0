"""A restart with nothing changed skips run.sh's set-up steps (scripts/setup_stamps.py),
and a step runs again as soon as one of its inputs changes: its files, the packages, the
database it writes (recreated, or migrated further), what collectstatic left."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sqlite3
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from types import ModuleType

import pytest

from tests.servers import ROOT

STEPS = ("migrate", "load_builtin", "seed_demo", "collectstatic")


def _stamps_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "setup_stamps", ROOT / "scripts" / "setup_stamps.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _database(path: Path, applied: int) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS django_migrations (id integer primary key, applied text)"
        )
        for _ in range(applied):
            conn.execute(
                "INSERT INTO django_migrations VALUES (NULL, ?)", [datetime.now().isoformat()]
            )
    conn.close()


@pytest.fixture
def stamps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, Path]:
    """The module over a checkout of its own: a migration, a scenario, a static file, the
    packages' stamp, collected static files and an embedded database."""
    module = _stamps_module()
    root, data = tmp_path / "checkout", tmp_path / "data"
    for name, text in {
        "aero/migrations/0001_initial.py": "# one",
        "scenarios_admin/data/scenarios/oil_spill.yaml": "slug: oil_spill",
        "aero/static/aero/aero.css": "body {}",
        "aero/settings.py": "",
        "aero/roles.py": "",
        "pyproject.toml": "[project]",
        ".venv/.installed": "",
        "staticfiles/aero/aero.css": "body {}",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    data.mkdir()
    _database(data / "aero.sqlite3", 3)
    monkeypatch.setattr(module, "ROOT", root)
    monkeypatch.setenv("AERO_DATA_DIR", str(data))
    for variable in ("DATABASE_URL", "DATABASE_OWNER_URL"):
        monkeypatch.delenv(variable, raising=False)
    return module, root


def _fresh(module: ModuleType) -> set[str]:
    return {step for step in STEPS if module.main(["x", "check", step]) == 0}


def _save_all(module: ModuleType) -> None:
    for step in STEPS:
        assert module.main(["x", "save", step]) == 0


def test_a_step_is_skipped_only_while_its_inputs_are_unchanged(
    stamps: tuple[ModuleType, Path],
) -> None:
    module, root = stamps
    data = Path(os.environ["AERO_DATA_DIR"])
    assert _fresh(module) == set()  # never run
    _save_all(module)
    assert _fresh(module) == set(STEPS)

    (root / "aero/migrations/0002_more.py").write_text("# two")
    assert _fresh(module) == set(STEPS) - {"migrate"}
    _save_all(module)

    (root / "scenarios_admin/data/scenarios/oil_spill.yaml").write_text("slug: oil_spill2")
    assert _fresh(module) == set(STEPS) - {"load_builtin"}
    _save_all(module)

    (root / "aero/static/aero/aero.css").write_text("body { margin: 0 }")
    assert _fresh(module) == set(STEPS) - {"collectstatic"}
    _save_all(module)
    shutil.rmtree(root / "staticfiles")  # `make clean`
    assert _fresh(module) == set(STEPS) - {"collectstatic"}
    (root / "staticfiles/aero").mkdir(parents=True)  # what collectstatic writes
    (root / "staticfiles/aero/aero.css").write_text("body { margin: 0 }")
    _save_all(module)
    assert _fresh(module) == set(STEPS)

    # Packages reinstalled: their migrations and static files may have changed.
    installed = root / ".venv/.installed"
    os.utime(installed, ns=(installed.stat().st_mtime_ns + 10**9,) * 2)
    assert _fresh(module) == {"seed_demo"}
    _save_all(module)

    # The database migrated further by hand, then recreated from nothing.
    _database(data / "aero.sqlite3", 1)
    assert _fresh(module) == {"collectstatic"}
    _save_all(module)
    (data / "aero.sqlite3").unlink()
    assert _fresh(module) == {"collectstatic"}
    _database(data / "aero.sqlite3", 4)
    assert _fresh(module) == {"collectstatic"}


def _setup(data: Path) -> subprocess.CompletedProcess[str]:
    # Not the caller's PROMETHEUS_MULTIPROC_DIR: run.sh empties that folder at start.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL")
        and not k.startswith(("AERO_", "DJANGO_", "PROMETHEUS_"))
    }
    env["AERO_DATA_DIR"] = str(data)
    return subprocess.run(
        ["bash", "scripts/run.sh", "--setup-only"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_run_sh_restarts_without_running_unchanged_steps(tmp_path: Path) -> None:
    first = _setup(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "skipped" not in first.stdout
    assert "operator-demo-pass" in first.stdout

    again = _setup(tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    for step in STEPS:
        assert f"Set-up: {step} skipped (inputs unchanged)" in again.stdout
    assert "operator-demo-pass" in again.stdout  # the demo users are still shown

    # A new database (deleted by hand): every step that writes it runs again.
    for leftover in tmp_path.glob("aero.sqlite3*"):
        leftover.unlink()
    fresh = _setup(tmp_path)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    skipped = {step for step in STEPS if f"Set-up: {step} skipped" in fresh.stdout}
    assert skipped == {"collectstatic"}
    assert "scenario oil_spill: published v1" in fresh.stdout
