"""Adding a scenario needs no Python: bird_strike and tire_burst exist only as data."""

from __future__ import annotations

from pathlib import Path

from scenarios_admin.builtin import DATA_DIR

ROOT = Path(__file__).resolve().parent.parent
DATA_ONLY = ("bird_strike", "tire_burst")
NOT_OURS = {"tests", "var", "staticfiles", "node_modules"}


def python_modules() -> list[Path]:
    return [
        path
        for path in ROOT.rglob("*.py")
        if not any(
            part.startswith(".") or part in NOT_OURS for part in path.relative_to(ROOT).parts
        )
    ]


def test_no_python_module_outside_tests_mentions_a_data_only_scenario() -> None:
    modules = python_modules()
    # The scan covers the runtime and the admin, so the test can fail.
    assert ROOT / "packs" / "airport" / "agent" / "nodes" / "reasoning.py" in modules
    assert ROOT / "scenarios_admin" / "admin.py" in modules
    assert not any(".venv" in path.parts for path in modules)
    offenders = [
        f"{path.relative_to(ROOT)} mentions {slug}"
        for path in modules
        for slug in DATA_ONLY
        if slug in path.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_they_ship_as_built_in_data_files() -> None:
    for slug in DATA_ONLY:
        assert (DATA_DIR / "scenarios" / f"{slug}.yaml").is_file()
