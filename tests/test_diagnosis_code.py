"""Code evidence through the reference MCP git server, in its own process: the blamed
deploy's hunk and the lines around a stack frame; a server that crashes, hangs or answers
an error fails that call only, and leaves no process behind."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from packs.diagnosis.code import CodeToolError, McpServer, call_tools, code, git_server, hunk_of

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
COMMIT = "f35ac8cefbd93b8ba7ed43af519117bbdf5bbbf3"  # D-5716 of ex-deploy-payments


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    into = tmp_path_factory.mktemp("bundle")
    with tarfile.open(EXAMPLES / "ex-deploy-payments.tar.gz") as tf:
        tf.extractall(into, filter="data")
    return into / "ex-deploy-payments" / "repo"


def test_the_blamed_line_with_its_hunk_through_the_git_server(repo: Path) -> None:
    found = code(repo, commit=COMMIT, path="payments/app/handlers.py", line=26, timeout=120)
    assert found.hunk.startswith("@@ -22,6 +22,9 @@")
    assert "+    return request.body['signature']  # new field" in found.hunk.splitlines()
    assert (26, "    return request.body['signature']  # new field") in found.excerpt
    assert [n for n, _ in found.excerpt] == list(range(22, 31))


def test_a_line_the_commit_did_not_touch_has_no_hunk(repo: Path) -> None:
    found = code(repo, commit=COMMIT, path="payments/app/handlers.py", line=2, timeout=120)
    assert found.hunk == "" and found.excerpt[0][0] == 1


def test_the_server_stays_inside_its_repository(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(CodeToolError, match="git_show"):
        call_tools(
            git_server(repo),
            [("git_show", {"repo_path": str(tmp_path), "revision": "HEAD"})],
            timeout=120,
        )


def _script(tmp_path: Path, body: str) -> McpServer:
    path = tmp_path / "server.py"
    path.write_text(body, "utf-8")
    return McpServer(sys.executable, [str(path)])


def _no_process_left(tmp_path: Path) -> bool:
    found = subprocess.run(["pgrep", "-f", str(tmp_path / "server.py")], capture_output=True)
    return found.returncode == 1


def test_a_crashing_server_fails_the_call(tmp_path: Path) -> None:
    server = _script(tmp_path, "import sys\nsys.stdin.readline()\nsys.exit(3)\n")
    with pytest.raises(CodeToolError, match="the server failed"):
        call_tools(server, [("git_show", {})], timeout=20)
    assert _no_process_left(tmp_path)


def test_a_hanging_server_fails_the_call_at_its_timeout(tmp_path: Path) -> None:
    server = _script(tmp_path, "import time\nwhile True:\n    time.sleep(1)\n")
    with pytest.raises(CodeToolError, match="no answer within 3 s"):
        call_tools(server, [("git_show", {})], timeout=3)
    assert _no_process_left(tmp_path)


def test_hunk_of_picks_the_file_and_the_hunk() -> None:
    diff = "\n".join(
        [
            "--- a/x.py",
            "+++ b/x.py",
            "@@ -1,2 +1,3 @@",
            " a",
            "+b",
            "--- a/y.py",
            "+++ b/y.py",
            "@@ -10,2 +10,2 @@",
            "--- removed line that looks like a header",
            "+new",
            "@@ -40,1 +40,2 @@",
            "+late",
        ]
    )
    assert hunk_of(diff, "y.py", 11).splitlines()[-1] == "+new"
    assert "--- removed line" in hunk_of(diff, "y.py", 10)
    assert hunk_of(diff, "y.py", 41) == "@@ -40,1 +40,2 @@\n+late"
    assert hunk_of(diff, "x.py", 40) == ""
