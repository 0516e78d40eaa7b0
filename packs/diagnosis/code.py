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
from pathlib import Path
from typing import Any

from django.conf import settings

from tools.client import PYTHON, McpError, ServerSpec
from tools.client import call_tools as mcp_call_tools
from tools.models import McpServer

HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
SERVER_NAME = "git"


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
