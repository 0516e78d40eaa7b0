"""The benchmarks are how the speed goals are checked (`make bench`), so each must at least
start: its command line parses and it prints its usage. A merge once left `bench/perf.py`
with two `--what` options, and `make bench` stopped at argparse without a figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(path.name for path in BENCH.glob("*.py"))


def test_every_benchmark_is_checked() -> None:
    assert "perf.py" in SCRIPTS and "llm_bound.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_benchmark_starts_and_prints_its_usage(script: str) -> None:
    result = subprocess.run(
        [sys.executable, str(BENCH / script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
