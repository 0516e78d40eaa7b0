"""Code evidence through the MCP git server, in its own process: the blamed deploy's hunk
and the lines around a stack frame; the server configured as data (the `McpServer` named
"git", `{repo}` filled) when there is one, the built-in definition otherwise; a server
that crashes, hangs or answers an error fails that call only, and leaves no process
behind."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import pytest

from packs.diagnosis.code import CodeToolError, call_tools, code, code_server, git_server, hunk_of
from tools.client import PYTHON, ServerSpec
from tools.models import McpServer

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
COMMIT = "f35ac8cefbd93b8ba7ed43af519117bbdf5bbbf3"  # D-5716 of ex-deploy-payments


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    into = tmp_path_factory.mktemp("bundle")
    with tarfile.open(EXAMPLES / "ex-deploy-payments.tar.gz") as tf:
        tf.extractall(into, filter="data")
    return into / "ex-deploy-payments" / "repo"


@pytest.mark.django_db
def test_the_blamed_line_with_its_hunk_through_the_git_server(repo: Path) -> None:
    found = code(repo, commit=COMMIT, path="payments/app/handlers.py", line=26)
    assert found.hunk.startswith("@@ -22,6 +22,9 @@")
    assert "+    return request.body['signature']  # new field" in found.hunk.splitlines()
    assert (26, "    return request.body['signature']  # new field") in found.excerpt
    assert [n for n, _ in found.excerpt] == list(range(22, 31))


@pytest.mark.django_db
def test_a_line_the_commit_did_not_touch_has_no_hunk(repo: Path) -> None:
    found = code(repo, commit=COMMIT, path="payments/app/handlers.py", line=2)
    assert found.hunk == "" and found.excerpt[0][0] == 1


def test_the_server_stays_inside_its_repository(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(CodeToolError, match="git_show"):
        call_tools(
            git_server(repo),
            [("git_show", {"repo_path": str(tmp_path), "revision": "HEAD"})],
        )


@pytest.mark.django_db
def test_the_configured_git_server_is_used_with_its_repository_filled(repo: Path) -> None:
    """The seeded row (its data migration): read-only git tools, `{repo}` filled."""
    row = McpServer.objects.get(name="git")
    assert row.args[-1] == "{repo}" and "git_commit" not in row.allowed_tools
    server = code_server(repo)
    assert server.args[-1] == str(repo) and server.allowed_tools == row.allowed_tools
    found = code(repo, commit=COMMIT, path="payments/app/handlers.py", line=26)
    assert found.hunk.startswith("@@ -22,6 +22,9 @@")
    # Its allowed tools are the row's: without git_show the code tool is refused.
    McpServer.objects.filter(name="git").update(allowed_tools=["git_log"])
    with pytest.raises(CodeToolError, match="the tool 'git_show' is not allowed"):
        code(repo, commit=COMMIT, path="payments/app/handlers.py", line=26)


@pytest.mark.django_db
def test_without_an_enabled_git_server_the_built_in_one_is_used(repo: Path) -> None:
    McpServer.objects.filter(name="git").update(enabled=False, allowed_tools=["git_log"])
    assert code_server(repo) == git_server(repo)
    found = code(repo, commit=COMMIT, path="payments/app/handlers.py", line=2)
    assert found.excerpt[0][0] == 1


def _script(tmp_path: Path, body: str) -> ServerSpec:
    path = tmp_path / "server.py"
    path.write_text(body, "utf-8")
    return ServerSpec("script", PYTHON, [str(path)])


def _no_process_left(tmp_path: Path) -> bool:
    found = subprocess.run(["pgrep", "-f", str(tmp_path / "server.py")], capture_output=True)
    return found.returncode == 1


def test_a_crashing_server_fails_the_call(tmp_path: Path) -> None:
    server = _script(tmp_path, "import sys\nsys.stdin.readline()\nsys.exit(3)\n")
    with pytest.raises(CodeToolError, match="the server exited with code 3"):
        call_tools(server, [("git_show", {})])
    assert _no_process_left(tmp_path)


def test_a_hanging_server_fails_the_call_at_its_timeout(tmp_path: Path) -> None:
    server = _script(tmp_path, "import time\nwhile True:\n    time.sleep(1)\n")
    server = ServerSpec(server.name, server.command, server.args, timeout=3)
    with pytest.raises(CodeToolError, match="no answer within 3 s"):
        call_tools(server, [("git_show", {})])
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
