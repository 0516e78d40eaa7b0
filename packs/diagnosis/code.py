"""Code evidence through an MCP git server: the one configured as data (the `McpServer`
named "git", its `{repo}` argument filled with the bundle's `repo/`), else the reference
`mcp-server-git` as built in.

Each exchange starts the server as its own process under its limits (tools.client); AERO
is a client through the `mcp` SDK. A server that is missing, crashes, hangs, breaks its
schema or answers an error fails that call with `CodeToolError` (the caller records it
and retries per policy), and its process is gone when the call returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from packs.diagnosis.bundle import Commit, Hunk
from tools.client import PYTHON, McpError, ServerSpec
from tools.client import call_tools as mcp_call_tools
from tools.models import McpServer

HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@ ?(.*)$")
SERVER_NAME = "git"
# At most this many commits of a window are read (git_log's max_count).
MAX_COMMITS = 50
DECLARED = re.compile(r"^\s*(?:async\s+)?(?:def|class|func|function)\s+[\w.]+")
LOGGED = re.compile(r"^Commit: ([0-9a-f]{40})$", re.MULTILINE)


class CodeToolError(RuntimeError):
    """The code tool failed: the server crashed, hung, refused or answered an error."""


def git_server(repo: Path) -> ServerSpec:
    """The built-in definition, used when no enabled server named "git" is configured."""
    return ServerSpec(
        SERVER_NAME,
        PYTHON,
        ["-m", "mcp_server_git", "--repository", str(repo)],
        timeout=settings.AERO_CODE_TOOL_TIMEOUT,
    )


def code_server(repo: Path, name: str = SERVER_NAME) -> ServerSpec:
    """The configured git server `name` for `repo` ({repo} filled), or the built-in one
    when no "git" is configured. A system's own server (by name) must still be there."""
    row = McpServer.objects.filter(name=name, enabled=True).first()
    if row is None and name != SERVER_NAME:
        raise CodeToolError(f"the code server {name} is no longer configured or enabled")
    if row is None:
        return git_server(repo)
    try:
        return row.spec().with_values({"repo": str(repo)})
    except ValueError as exc:  # a secret the configured keys cannot decrypt
        raise CodeToolError(f"the {SERVER_NAME} server's secrets: {exc}") from None


def call_tools(server: ServerSpec, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The calls in one server process of its own; the text each answered."""
    try:
        return mcp_call_tools(server, calls)
    except McpError as exc:
        raise CodeToolError(str(exc)) from None


@dataclass(frozen=True)
class CodeLookup:
    commit: str
    path: str
    line: int | None
    hunk: str  # the diff hunk of `commit` holding `line` ("" when the commit did not touch it)
    excerpt: list[tuple[int, str]]  # (line number, text) around `line` at `commit`


def code(
    repo: Path,
    *,
    commit: str,
    path: str,
    line: int | None = None,
    context: int = 4,
    server: ServerSpec | None = None,
) -> CodeLookup:
    """A commit's diff hunk for `path:line` and the lines around it, read through MCP."""
    server = server or code_server(repo)
    base = {"repo_path": str(repo)}
    diff, text = call_tools(
        server,
        [
            ("git_show", {**base, "revision": commit}),
            ("git_show", {**base, "revision": f"{commit}:{path}"}),
        ],
    )
    lines = text.splitlines()
    if line is None:
        excerpt = list(enumerate(lines[: 2 * context + 1], start=1))
    else:
        first = max(1, line - context)
        excerpt = [(n, lines[n - 1]) for n in range(first, min(len(lines), line + context) + 1)]
    return CodeLookup(commit, path, line, hunk_of(diff, path, line), excerpt)


def hunk_of(diff: str, path: str, line: int | None) -> str:
    """The hunk of `path` in a unified diff whose new side holds `line` (the first, if
    None); "" when the diff did not touch that line."""
    rows = diff.splitlines()
    hunks: list[tuple[int, int, list[str]]] = []
    in_file = False
    for index, row in enumerate(rows):
        # A file header is a "--- " row followed by "+++ " (a removed line may start "---").
        if row.startswith("--- ") and index + 1 < len(rows) and rows[index + 1].startswith("+++ "):
            in_file = rows[index + 1][4:].removeprefix("b/") == path
            continue
        if row.startswith("+++ ") or not in_file:
            continue
        match = HUNK.match(row)
        if match:
            hunks.append((int(match.group(1)), int(match.group(2) or 1), [row]))
        elif hunks:
            hunks[-1][2].append(row)
    for start, length, body in hunks:
        if line is None or start <= line < start + max(length, 1):
            return "\n".join(body)
    return ""


def recent_commits(
    repo: Path, *, since: datetime, until: datetime, server: ServerSpec | None = None
) -> list[Commit]:
    """The commits of `repo` between `since` and `until` (newest first) with the files
    and lines each changed, read through MCP: `git_log` over the window, then `git_show`
    of each commit, two exchanges with the server."""
    server = server or code_server(repo)
    base = {"repo_path": str(repo)}
    (log,) = call_tools(
        server,
        [
            (
                "git_log",
                {
                    **base,
                    "max_count": MAX_COMMITS,
                    "start_timestamp": since.isoformat(),
                    "end_timestamp": until.isoformat(),
                },
            )
        ],
    )
    shas = list(dict.fromkeys(LOGGED.findall(log)))
    if not shas:
        return []
    shown = call_tools(server, [("git_show", {**base, "revision": sha}) for sha in shas])
    commits = [commit_of(sha, text) for sha, text in zip(shas, shown, strict=True)]
    # git's window is the committer's time; the change is when it was authored.
    return [c for c in commits if since <= c.at <= until]


def commit_of(sha: str, shown: str) -> Commit:
    """A commit from `git_show`'s text (its header as `git show --date=iso` prints it, then
    its patch): when, who, what, and the first changed line of each hunk of each file."""
    header, _, _ = shown.partition("\n--- ")
    author = re.search(r"^Author: (.*)$", header, re.MULTILINE)
    date = re.search(r"^Date:\s+(.*)$", header, re.MULTILINE)
    if date is None:
        raise CodeToolError(f"git_show of {sha[:10]} answered no date")
    try:
        at = datetime.strptime(date.group(1).strip(), "%Y-%m-%d %H:%M:%S %z")
    except ValueError:
        raise CodeToolError(
            f"git_show of {sha[:10]}: an unreadable date {date.group(1)!r}"
        ) from None
    message = "\n".join(row[4:] for row in header.splitlines() if row.startswith("    ")).strip()
    return Commit(
        commit=sha,
        at=at,
        author=author.group(1).strip() if author else "",
        message=message,
        files=changed_hunks(shown),
    )


def changed_hunks(diff: str) -> dict[str, list[Hunk]]:
    """Per file of a unified diff (its new path; a deleted file is left out): each hunk's
    first added line on the new side, and the function git names in the hunk header."""
    rows = diff.splitlines()
    files: dict[str, list[Hunk]] = {}
    path: str | None = None
    line = 0
    pending: tuple[int, str] | None = None  # the current hunk, until its first added line
    for index, row in enumerate(rows):
        if row.startswith("--- ") and index + 1 < len(rows) and rows[index + 1].startswith("+++ "):
            target = rows[index + 1][4:]
            path = None if target == "/dev/null" else target.removeprefix("b/")
            if path is not None:
                files.setdefault(path, [])
            pending = None
            continue
        if path is None or row.startswith("+++ "):
            continue
        match = HUNK.match(row)
        if match:
            line, pending = int(match.group(1)), (int(match.group(1)), match.group(3).strip())
            continue
        if pending is None:
            continue
        if row.startswith("+"):
            # A hunk that adds a function is about that one, not the one git's header
            # names (the nearest before it).
            added = DECLARED.match(row[1:])
            function = added.group(0).rstrip("(:{ ") if added else pending[1]
            files[path].append(Hunk(line=max(line, 1), function=function))
            pending = None
            line += 1
        elif row.startswith(" "):
            line += 1
    return {p: hunks for p, hunks in files.items() if hunks}
