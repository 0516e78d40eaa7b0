"""Code evidence through the reference MCP git server (`mcp-server-git`).

The server runs as its own process over stdio with the bundle's `repo/` as its only
repository; AERO is a client through the `mcp` SDK. A server that crashes, hangs or
answers an error fails that call with `CodeToolError` (the caller records it and retries
per policy), and its process is gone when the call returns.
"""

from __future__ import annotations

import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class CodeToolError(RuntimeError):
    """The code tool failed: the server crashed, hung, refused or answered an error."""


@dataclass(frozen=True)
class McpServer:
    """How to start one MCP server (admins configure these as data later)."""

    command: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)


def git_server(repo: Path) -> McpServer:
    return McpServer(sys.executable, ["-m", "mcp_server_git", "--repository", str(repo)])


def call_tools(
    server: McpServer, calls: list[tuple[str, dict[str, Any]]], *, timeout: float
) -> list[str]:
    """The calls, in order, in one server process of its own (started and stopped here);
    the text each answered. `timeout` bounds the whole exchange, start-up included."""

    # The MCP client is imported here, not with the pack: it cost every web process
    # about half a second of CPU at start; the workers import it in their warm-up.
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    async def exchange() -> list[str]:
        params = StdioServerParameters(command=server.command, args=server.args, env=server.env)
        texts = []
        with Path(os.devnull).open("w") as errlog, anyio.fail_after(timeout):
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                for tool, arguments in calls:
                    result = await session.call_tool(tool, arguments)
                    text = "\n".join(getattr(part, "text", "") for part in result.content)
                    if result.is_error:
                        raise CodeToolError(f"{tool}: {text.strip()[:300] or 'an error'}")
                    texts.append(text)
        return texts

    def run() -> list[str]:
        try:
            return anyio.run(exchange)
        except CodeToolError:
            raise
        except TimeoutError:
            raise CodeToolError(f"no answer within {timeout:g} s") from None
        except Exception as exc:  # a crashed server surfaces as many kinds of error
            raise CodeToolError(f"the server failed ({_first_cause(exc)})") from None

    # A fresh thread: the caller may already run an event loop (an ASGI or test thread).
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


def _first_cause(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:200]


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
    timeout: float = 30.0,
    server: McpServer | None = None,
) -> CodeLookup:
    """A commit's diff hunk for `path:line` and the lines around it, read through MCP."""
    server = server or git_server(repo)
    base = {"repo_path": str(repo)}
    diff, text = call_tools(
        server,
        [
            ("git_show", {**base, "revision": commit}),
            ("git_show", {**base, "revision": f"{commit}:{path}"}),
        ],
        timeout=timeout,
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
