"""Issue 34: every command README.md shows is run by a test.

The README's fenced code blocks are parsed into commands; each has a row in HOW (the
command -> the test that runs it). A new command without a row, or a row for a command
the README no longer shows, fails `test_every_readme_command_has_a_test`. The commands
are taken from the README itself, run with the test's own port and data directory:
`make run` is started, checked for readiness and stopped; the CLI demos (offline and
with the simulated model) run beside it."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from diagnosis.actions import do_create_session
from scenarios_admin.models import Scenario
from tests.servers import ROOT, free_port
from tests.settings import TEST_DB_NAME

README = ROOT / "README.md"
HERE = "tests/test_readme.py"
DB_ROLES = "tests/test_db_roles.py"
SUPERVISOR = (
    "tests/test_run_supervisor.py::test_killed_processes_are_restarted_however_close_together"
)

# The README's command (program and sub-command, after its environment variables) -> the
# test that runs it. Tests elsewhere run what needs a set-up of its own (production mode:
# a scratch database, the app's role).
HOW: dict[str, str] = {
    "make run": f"{HERE}::test_make_run_serves_and_the_cli_demos_complete_beside_it",
    "manage.py incident": f"{HERE}::test_make_run_serves_and_the_cli_demos_complete_beside_it",
    "manage.py fake_llm": f"{HERE}::test_make_run_serves_and_the_cli_demos_complete_beside_it",
    "manage.py shell": f"{HERE}::test_make_run_serves_and_the_cli_demos_complete_beside_it",
    "make test": f"{HERE}::test_make_test_runs_pytest_after_the_set_up",
    "export AERO_ENCRYPTION_KEYS AERO_SECRET_KEY": SUPERVISOR,
    "AERO_HTTPS DATABASE_OWNER_URL DATABASE_URL REDIS_URL make run": SUPERVISOR,
    "make lint": f"{HERE}::test_make_lint_and_messages",
    "make messages": f"{HERE}::test_make_lint_and_messages",
    "make clean": f"{HERE}::test_make_clean_removes_what_it_says",
    # Minutes each (the type check, the whole suite, the benchmarks): their recipes are
    # checked to be what the merge gate, this suite and tests/test_bench_scripts.py run.
    "make typecheck": f"{HERE}::test_the_long_make_targets_run_what_the_checks_run",
    "make check": f"{HERE}::test_the_long_make_targets_run_what_the_checks_run",
    "make bench": f"{HERE}::test_the_long_make_targets_run_what_the_checks_run",
    "manage.py verify_chain": f"{HERE}::test_the_management_commands",
    "manage.py verify_audit": f"{HERE}::test_the_management_commands",
    "manage.py rebuild_search": f"{HERE}::test_the_management_commands",
    "manage.py load_builtin": f"{HERE}::test_the_management_commands",
    "manage.py scenario": f"{HERE}::test_the_management_commands",
    "manage.py rotate_keys": f"{HERE}::test_the_management_commands",
    "manage.py seed_demo": f"{HERE}::test_the_management_commands",
    "manage.py db_roles": f"{DB_ROLES}::test_db_roles_changes_the_grants_in_one_transaction",
}

ASSIGNMENT = re.compile(r"^[A-Z_][A-Z0-9_]*=")


@dataclass(frozen=True)
class Command:
    block: int  # which fenced block, from 0
    text: str  # the command as shown, continuation lines joined, comment dropped
    key: str
    background: bool


def _key(words: list[str]) -> str:
    names = sorted(w.split("=", 1)[0] for w in words if ASSIGNMENT.match(w))
    rest = [w for w in words if not ASSIGNMENT.match(w)]
    if rest and rest[0] == "export":
        return " ".join(["export", *names])
    if len(rest) >= 3 and rest[0].endswith("python") and rest[1] == "manage.py":
        program = f"manage.py {rest[2]}"
    elif len(rest) >= 2 and rest[0] == "make":
        program = f"make {rest[1]}"
    else:
        program = " ".join(rest[:2])
    return " ".join([*names, program])


def readme_commands(text: str | None = None) -> list[Command]:
    text = README.read_text() if text is None else text
    commands = []
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    for number, block in enumerate(blocks):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            background = bool(words) and words[-1] == "&"
            words = words[:-1] if background else words
            # `make lint | make typecheck | …` lists several commands on one line.
            parts: list[list[str]] = [[]]
            for word in words:
                if word == "|":
                    parts.append([])
                else:
                    parts[-1].append(word)
            for part in parts:
                if part:
                    shown = shlex.join(part) if len(parts) > 1 else line.split(" #")[0]
                    shown = shown.strip().removesuffix("&").strip()
                    commands.append(Command(number, shown, _key(part), background))
    return commands


def test_the_parser_reads_each_command_and_its_key() -> None:
    text = (
        "```\nmake run     # start\nmake lint | make clean\n```\n\n```\n"
        "A=1 B=2 make run\n.venv/bin/python manage.py fake_llm --port 1 \\\n  --script x &\n```\n"
    )

    commands = readme_commands(text)

    assert [(c.block, c.key, c.background) for c in commands] == [
        (0, "make run", False),
        (0, "make lint", False),
        (0, "make clean", False),
        (1, "A B make run", False),
        (1, "manage.py fake_llm", True),
    ]
    assert commands[0].text == "make run"
    assert commands[4].text == ".venv/bin/python manage.py fake_llm --port 1    --script x"


def test_every_readme_command_has_a_test() -> None:
    shown = {c.key for c in readme_commands()}

    assert sorted(shown - set(HOW)) == [], "README commands without a test: add a row to HOW"
    assert sorted(set(HOW) - shown) == [], "rows for commands the README no longer shows"
    for where in set(HOW.values()):
        path, name = where.split("::")
        tree = ast.parse((ROOT / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in names, f"{where} does not exist"


# --- make run and the demos beside it -----------------------------------------------


def _embedded_env(data: Path, port: int) -> dict[str, str]:
    """A newcomer's shell: no DATABASE_URL or REDIS_URL, nothing of the test settings."""
    # Not the caller's PROMETHEUS_MULTIPROC_DIR: run.sh empties that folder at start.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "REDIS_URL")
        and not k.startswith(("AERO_", "DJANGO_", "PROMETHEUS_"))
    }
    env.update(AERO_DATA_DIR=str(data), AERO_PORT=str(port), PYTHONUNBUFFERED="1")
    return env


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


@contextmanager
def started(text: str, env: dict[str, str], ready: str, log: Path) -> Iterator[None]:
    """A long-running command, started as the README shows it, until `ready` answers 200;
    stopped (its whole process group) at the end."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["bash", "-c", text],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while _status(ready) != 200:
            assert process.poll() is None, f"{text!r} exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{ready} not up: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run(text: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", text], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def completed_demo(result: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    # Run to its end, every decision applied: not "running" with nothing done.
    assert summary["status"] == "completed", summary
    actions = summary["actions"]
    assert isinstance(actions, list) and actions
    assert {a["status"] for a in actions} == {"completed"}
    assert summary["risk"] == {"level": "HIGH", "rule": "OS-01", "score": 95}
    assert str(summary["report_markdown"]).startswith("# ")
    return summary


@pytest.mark.long
def test_make_run_serves_and_the_cli_demos_complete_beside_it(tmp_path: Path) -> None:
    commands = readme_commands()
    make_run = next(c for c in commands if c.key == "make run")
    offline = next(c for c in commands if c.key == "manage.py incident")
    simulated = [c for c in commands if c.block == offline.block + 1]
    assert [c.key for c in simulated] == ["manage.py fake_llm", "manage.py shell", offline.key]
    port, model_port = free_port(), free_port()
    env = _embedded_env(tmp_path, port)

    with started(make_run.text, env, f"http://127.0.0.1:{port}/healthz", tmp_path / "run.log"):
        assert _status(f"http://127.0.0.1:{port}/accounts/login/") == 200
        completed_demo(run(offline.text, env))

        server, configure, demo = (c.text.replace("8765", str(model_port)) for c in simulated)
        assert simulated[0].background
        models = f"http://127.0.0.1:{model_port}/v1/models"
        with started(server, env, models, tmp_path / "fake_llm.log"):
            assert run(configure, env).returncode == 0
            session = completed_demo(run(demo, env))["session"]

    # The simulated model answered this session's calls (not the web server's runner,
    # which took them before and left the command "running").
    with sqlite3.connect(tmp_path / "aero.sqlite3") as db:
        providers = {
            row[0]
            for row in db.execute(
                "SELECT json_extract(payload, '$.provider') FROM diagnosis_event "
                "WHERE session_id = ? AND type = 'llm.call'",
                [str(session).replace("-", "")],
            )
        }
    db.close()
    assert providers == {"fake"}


# --- make targets ---------------------------------------------------------------------


def _make(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", *args],
        cwd=cwd,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_make_lint_and_messages() -> None:
    for target in ("lint", "messages"):
        assert f"make {target}" in {c.key for c in readme_commands()}
        result = _make(target)
        assert result.returncode == 0, result.stdout + result.stderr
    assert (ROOT / "locale/zh_Hans/LC_MESSAGES/django.mo").stat().st_size > 10_000


def test_make_clean_removes_what_it_says(tmp_path: Path) -> None:
    """In a copy of the Makefile: the checkout's own .venv and data stay."""
    (tmp_path / "Makefile").write_text((ROOT / "Makefile").read_text())
    made = [".venv/bin/python", "var/aero.sqlite3", "staticfiles/x.css", ".mypy_cache/x"]
    made.append("locale/zh_Hans/LC_MESSAGES/django.po")
    for name in made:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    (tmp_path / "locale/zh_Hans/LC_MESSAGES/django.mo").write_text("x")

    result = _make("clean", cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["Makefile", "locale/zh_Hans/LC_MESSAGES/django.po"]


def _recipe(target: str) -> list[str]:
    # --always-make: the dry run prints `install`'s steps too, whatever the stamps say.
    result = _make("--dry-run", "--always-make", target)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_long_make_targets_run_what_the_checks_run() -> None:
    assert ".venv/bin/mypy ." in _recipe("typecheck")
    check = _recipe("check")
    for line in (".venv/bin/ruff check .", ".venv/bin/ruff format --check .", ".venv/bin/mypy ."):
        assert line in check
    assert any(line.startswith(".venv/bin/pytest -n 2 --dist loadgroup") for line in check)
    from tests.test_bench_scripts import SCRIPTS

    bench = [line for line in _recipe("bench") if line.startswith(".venv/bin/python bench/")]
    assert bench and {line.split()[1] for line in bench} <= {f"bench/{s}" for s in SCRIPTS}


@pytest.mark.long
@pytest.mark.services
def test_make_test_runs_pytest_after_the_set_up() -> None:
    """`make test` on one small test of this file, as its own run (its own test database
    name, so its end-of-run clean-up leaves this run's keys alone)."""
    result = _make(
        "test",
        "TEST_WORKERS=0",
        "PYTEST_ARGS=-p no:cacheprovider -o addopts= -q "
        "tests/test_readme.py::test_the_parser_reads_each_command_and_its_key",
        AERO_TEST_DB=f"{TEST_DB_NAME}_make",
    )

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout


# --- the management commands ------------------------------------------------------------


@pytest.mark.services
def test_the_management_commands(builtin: None, alice: User, tmp_path: Path) -> None:
    """Each `manage.py` line of the README's command list, against this run's database
    (the one-line `a|b|c` and `[OPTION]` forms spelled out). In this process: ten
    `manage.py` start-ups took 215 s on the loaded 2-core machine; `make run` and the CLI
    demos above run as processes."""
    session = do_create_session(alice, Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏")
    shown = {c.key for c in readme_commands() if c.key.startswith("manage.py ")}
    exported = tmp_path / "oil_spill.yaml"
    runs: dict[str, list[list[str]]] = {
        "verify_chain": [[], [str(session.pk)]],
        "verify_audit": [[]],
        "rebuild_search": [[]],
        "load_builtin": [[], ["--update"]],
        "scenario": [
            ["check", "oil_spill"],
            ["export", "oil_spill", "--out", str(exported)],
            ["import", str(exported)],
        ],
        "rotate_keys": [[]],
        "seed_demo": [[]],
    }
    for name, variants in runs.items():
        assert f"manage.py {name}" in shown
        for args in variants:
            out = io.StringIO()
            try:
                call_command(name, *args, stdout=out, stderr=out)
            except (CommandError, SystemExit) as exc:
                pytest.fail(f"manage.py {name} {shlex.join(args)}: {exc} {out.getvalue()}")
    assert "slug: oil_spill" in exported.read_text()
