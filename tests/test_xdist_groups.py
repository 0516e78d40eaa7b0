"""`--dist loadgroup` runs the tests of one `xdist_group` on one worker, one after
another (the fault suite shares one cluster and kills its processes; the run supervisor's
second run reuses the first's set-up). With pytest 9.2 and pytest-xdist 3.8 the group
was silently dropped and the fault suite ran on both workers, two clusters at once
(tests/xdist_groups.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.xdist_group("xdist_groups_self_check")
def test_this_suites_grouped_tests_carry_their_group(request: pytest.FixtureRequest) -> None:
    # Under xdist's loadgroup (as `make test` runs) the scheduler reads the group from here.
    if request.config.getoption("loadgroup", default=False):
        assert request.node.nodeid.endswith("@xdist_groups_self_check")


def test_a_group_runs_on_one_worker_and_the_rest_on_both(tmp_path: Path) -> None:
    # The tests' own conftest, as tests/conftest.py hooks it in.
    (tmp_path / "conftest.py").write_text(
        textwrap.dedent(
            """
            import pytest
            from tests import xdist_groups

            @pytest.hookimpl(trylast=True)
            def pytest_collection_modifyitems(config, items):
                xdist_groups.name_groups(config, items)
            """
        )
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for module in ("a", "b"):
        (tmp_path / f"test_{module}.py").write_text(
            textwrap.dedent(
                """
                import time
                import pytest

                @pytest.mark.xdist_group("together")
                @pytest.mark.parametrize("i", range(4))
                def test_grouped(i):
                    time.sleep(0.05)

                @pytest.mark.parametrize("i", range(4))
                def test_free(i):
                    time.sleep(0.05)
                """
            )
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # xdist only: the others' imports take seconds
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "xdist", "-p", "no:cacheprovider"),
            *("-n", "2", "--dist", "loadgroup", "-v"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", result.stdout)
    grouped = {(worker, test) for worker, test in ran if "test_grouped" in test}
    assert len(grouped) == 8, result.stdout[-3000:]
    assert all(test.endswith("@together") for _, test in grouped), grouped
    assert len({worker for worker, _ in grouped}) == 1, sorted(grouped)
    assert len(ran) == 16
