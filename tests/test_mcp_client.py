"""MCP servers, each exchange in a server process of its own under limits: the reference
servers (`mcp-server-git`, `mcp-server-time`) discovered and called, and servers that are
missing, crash, hang, lie (an answer breaking the schema they listed), eat memory or CPU:
each fails its own exchange with an outcome and a message that say which, and leaves no
process behind, even when the process that called it is killed mid-call."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.client import PYTHON, McpError, ServerSpec, call_tools, discover

FAKE = Path(__file__).resolve().with_name("fake_mcp_server.py")
ROOT = Path(__file__).resolve().parent.parent


def fake(tmp_path: Path, mode: str, **limits: float) -> ServerSpec:
    """The fake server copied under tmp_path, so that its processes can be found by path."""
    copy = tmp_path / "fake_server.py"
    shutil.copy(FAKE, copy)
    return ServerSpec("fake", PYTHON, [str(copy), mode], **limits)  # type: ignore[arg-type]


def processes_running(tmp_path: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    return found.stdout.split()


def my_children() -> set[str]:
    """This process's children: under xdist the worker also holds servers and browsers
    of earlier tests, so a test compares the set before and after."""
    found = subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True)
    return set(found.stdout.split())


def test_the_time_server_lists_its_tools_with_their_schemas() -> None:
    tools = {
        tool.name: tool for tool in discover(ServerSpec("time", PYTHON, ["-m", "mcp_server_time"]))
    }
    assert set(tools) == {"get_current_time", "convert_time"}
    assert "timezone" in tools["get_current_time"].input_schema["properties"]
    assert tools["get_current_time"].input_schema["required"] == ["timezone"]


def test_the_time_server_answers_a_call() -> None:
    spec = ServerSpec("time", PYTHON, ["-m", "mcp_server_time"], memory_mb=256)
    (text,) = call_tools(spec, [("get_current_time", {"timezone": "Asia/Shanghai"})])
    answer = json.loads(text)
    assert answer["timezone"] == "Asia/Shanghai" and answer["datetime"].endswith("+08:00")


def test_the_git_server_lists_its_tools(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    spec = ServerSpec("git", PYTHON, ["-m", "mcp_server_git", "--repository", str(tmp_path)])
    names = {tool.name for tool in discover(spec)}
    assert {"git_show", "git_log", "git_status", "git_commit"} <= names


def test_a_tool_not_allowed_is_refused_before_anything_starts(tmp_path: Path) -> None:
    spec = ServerSpec("time", PYTHON, ["-m", "mcp_server_time"], allowed_tools=["convert_time"])
    with pytest.raises(McpError, match="the tool 'get_current_time' is not allowed") as caught:
        call_tools(spec, [("get_current_time", {"timezone": "UTC"})])
    assert caught.value.outcome == "refused"


def test_a_missing_command_is_said_plainly() -> None:
    with pytest.raises(McpError, match="the command 'no-such-mcp-server' was not found") as caught:
        discover(ServerSpec("nothing", "no-such-mcp-server", []))
    assert caught.value.outcome == "not_found"


def test_an_honest_server_passes_and_a_lying_one_fails_its_call(tmp_path: Path) -> None:
    assert call_tools(fake(tmp_path, "honest"), [("count", {})]) == ["3"]
    with pytest.raises(McpError, match="'many' is not of type 'integer'") as caught:
        call_tools(fake(tmp_path, "lying"), [("count", {})])
    assert caught.value.outcome == "lying"
    assert processes_running(tmp_path) == []


def test_a_schema_that_is_not_json_schema_is_a_lie(tmp_path: Path) -> None:
    with pytest.raises(McpError, match="the tool 'count' lists a schema that is not") as caught:
        discover(fake(tmp_path, "bad-schema"))
    assert caught.value.outcome == "lying"


def test_a_crashing_server_fails_the_call_saying_how(tmp_path: Path) -> None:
    with pytest.raises(McpError, match="the server exited with code 3") as caught:
        call_tools(fake(tmp_path, "crash"), [("count", {})])
    assert caught.value.outcome == "crashed"
    assert processes_running(tmp_path) == []


def test_a_hung_server_is_timed_out_and_no_process_is_left(tmp_path: Path) -> None:
    before = my_children()
    started = time.monotonic()
    with pytest.raises(McpError, match="no answer within 3 s") as caught:
        call_tools(fake(tmp_path, "hang", timeout=3), [("count", {})])
    assert caught.value.outcome == "timed_out"
    assert time.monotonic() - started < 12  # the timeout, then at most the SDK's kill
    assert processes_running(tmp_path) == [] and my_children() <= before


def test_a_server_eating_memory_meets_its_limit(tmp_path: Path) -> None:
    with pytest.raises(McpError, match="MemoryError") as caught:
        call_tools(fake(tmp_path, "hog-memory", memory_mb=128, timeout=60), [("count", {})])
    assert caught.value.outcome == "crashed"
    assert processes_running(tmp_path) == []


def test_a_server_eating_cpu_meets_its_limit_before_its_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(McpError, match=r"killed by SIGXCPU \(its CPU limit, 2 s\)") as caught:
        call_tools(fake(tmp_path, "hog-cpu", cpu_seconds=2, timeout=60), [("count", {})])
    assert caught.value.outcome == "crashed"
    assert time.monotonic() - started < 30
    assert processes_running(tmp_path) == []


def test_a_secret_in_the_environment_reaches_the_server_and_never_its_errors(
    tmp_path: Path,
) -> None:
    script = tmp_path / "says_its_secret.py"
    script.write_text(
        "import os, sys\nsys.stdin.readline()\n"
        "print('token is', os.environ['TOKEN'], file=sys.stderr)\nsys.exit(1)\n"
    )
    spec = ServerSpec("s", PYTHON, [str(script)], secret_env={"TOKEN": "hunter2-very-secret"})
    with pytest.raises(McpError) as caught:
        call_tools(spec, [("count", {})])
    assert "token is [redacted]" in str(caught.value)
    assert "hunter2" not in str(caught.value)


def test_a_caller_killed_mid_call_leaves_no_server(tmp_path: Path) -> None:
    """A worker killed hard (SIGKILL: no clean-up runs) while a server is busy: the
    launcher and the server die with it (PR_SET_PDEATHSIG)."""
    spec = fake(tmp_path, "hang", timeout=120)
    # The server's arguments by environment: the caller's own command line must not name
    # tmp_path, or it would count among the processes found there.
    caller = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json, os; from tools.client import ServerSpec, call_tools; "
            "args = json.loads(os.environ['FAKE_ARGS']); "
            f"call_tools(ServerSpec('fake', '{PYTHON}', args, timeout=120), [('count', {{}})])",
        ],
        cwd=ROOT,
        env={**os.environ, "FAKE_ARGS": json.dumps(spec.args)},
    )
    try:
        deadline = time.monotonic() + 30
        while len(processes_running(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(processes_running(tmp_path)) == 2  # the launcher and the server
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 10
    while processes_running(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_running(tmp_path) == []
