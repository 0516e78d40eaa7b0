"""AERO as an MCP client: one server process per exchange, under limits, with a clear
answer for every way a server can fail.

Each exchange (a discovery, or a list of calls) starts the server through `launch.py`
(its own process group, an address-space and a CPU-time limit, death with its parent),
talks to it through the `mcp` SDK over stdio within one deadline, and stops it when the
exchange ends, however it ends. A server that is not there, crashes, hangs, breaks the
protocol or answers outside its own schemas fails that exchange with `McpError`, whose
`outcome` names which; nothing else is affected.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio

from aero.redact import redact

LAUNCHER = Path(__file__).resolve().with_name("launch.py")
# `{python}` as a command is the interpreter AERO runs on (its virtualenv's servers).
PYTHON = "{python}"
MAX_MESSAGE = 400

Outcome = Literal["started", "not_found", "crashed", "timed_out", "lying", "refused", "tool_error"]


class McpError(RuntimeError):
    """An exchange with an MCP server failed; `outcome` says how (see Outcome)."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True)
class ServerSpec:
    """How to start one MCP server and the limits of each exchange with it."""

    name: str
    command: str
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # Secret values: passed to the server, never shown (redacted from its errors).
    secret_env: dict[str, str] = field(default_factory=dict)
    allowed_tools: list[str] = field(default_factory=list)  # empty: every tool it lists
    timeout: float = 30.0
    memory_mb: int = 512
    cpu_seconds: int = 30

    def with_values(self, values: dict[str, str]) -> ServerSpec:
        """The spec with each `{name}` placeholder of its arguments filled from `values`
        (e.g. `{repo}`: the session's repository)."""
        args = list(self.args)
        for name, value in values.items():
            args = [arg.replace("{" + name + "}", value) for arg in args]
        return ServerSpec(
            self.name,
            self.command,
            args,
            dict(self.env),
            dict(self.secret_env),
            list(self.allowed_tools),
            self.timeout,
            self.memory_mb,
            self.cpu_seconds,
        )

    def allows(self, tool: str) -> bool:
        return not self.allowed_tools or tool in self.allowed_tools


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None


def resolve_command(spec: ServerSpec) -> str:
    """The executable's path, or McpError("not_found") before anything is started."""
    if spec.command == PYTHON:
        return sys.executable
    path = spec.env.get("PATH") or os.environ.get("PATH", "")
    found = shutil.which(spec.command, path=path)
    if found is None:
        raise McpError("not_found", f"the command {spec.command!r} was not found")
    return found


def discover(spec: ServerSpec) -> list[ToolInfo]:
    """Start the server, list its tools (each schema checked), stop it."""
    return _exchange(spec, [], discover=True)[1]


def call_tools(spec: ServerSpec, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The calls, in order, in one server process of its own; the text each answered.
    A tool the server is not allowed is refused before the server is started."""
    for tool, _ in calls:
        if not spec.allows(tool):
            raise McpError("refused", f"{spec.name}: the tool {tool!r} is not allowed")
    return _exchange(spec, calls, discover=False)[0]


def _exchange(
    spec: ServerSpec, calls: list[tuple[str, dict[str, Any]]], *, discover: bool
) -> tuple[list[str], list[ToolInfo]]:
    # The MCP client is imported here, not at start-up: it cost every web process about
    # half a second of CPU; the workers import it in their warm-up.
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    command = resolve_command(spec)
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            str(LAUNCHER),
            f"--mem={spec.memory_mb}",
            f"--cpu={spec.cpu_seconds}",
            "--",
            command,
            *spec.args,
        ],
        env={**spec.env, **spec.secret_env},
    )

    async def exchange(errlog: Any) -> tuple[list[str], list[ToolInfo]]:
        texts: list[str] = []
        tools: list[ToolInfo] = []
        with anyio.fail_after(spec.timeout):
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                if discover:
                    listed = await session.list_tools()
                    tools = [_checked(tool) for tool in listed.tools]
                for tool, arguments in calls:
                    try:
                        result = await session.call_tool(tool, arguments)
                    except RuntimeError as exc:
                        if "structured content" in str(exc):  # the SDK's schema check
                            first = str(exc).splitlines()[0]
                            raise McpError("lying", f"{tool}: {first}") from None
                        raise
                    text = "\n".join(getattr(part, "text", "") for part in result.content)
                    if result.is_error:
                        raise McpError("tool_error", f"{tool}: {text.strip()[:300] or 'an error'}")
                    texts.append(text)
        return texts, tools

    def run() -> tuple[list[str], list[ToolInfo]]:
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
            try:
                return anyio.run(exchange, errlog)
            except TimeoutError:
                raise McpError("timed_out", f"no answer within {spec.timeout:g} s") from None
            except Exception as exc:  # a crashed server surfaces as many kinds of error
                # Raised inside the SDK's task groups, ours arrive wrapped in a group.
                cause = _first_cause(exc)
                if isinstance(cause, McpError):
                    raise McpError(cause.outcome, _clean(str(cause), spec)) from None
                if _is_protocol(cause):
                    raise McpError(
                        "lying", _clean(f"the server broke the MCP protocol ({cause})", spec)
                    ) from None
                raise McpError("crashed", _clean(_crash(cause, errlog), spec)) from None

    # A fresh thread: the caller may already run an event loop (an ASGI or test thread).
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


def _checked(tool: Any) -> ToolInfo:
    """A listed tool whose schemas are JSON Schemas; McpError("lying") otherwise."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    for schema in (tool.input_schema, tool.output_schema):
        if schema is None:
            continue
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError as exc:
            raise McpError(
                "lying",
                f"the tool {tool.name!r} lists a schema that is not JSON Schema: {exc.message}",
            ) from None
    return ToolInfo(tool.name, tool.description or "", dict(tool.input_schema), tool.output_schema)


def _first_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _is_protocol(exc: BaseException) -> bool:
    from pydantic import ValidationError

    return isinstance(exc, ValidationError | ValueError) and not isinstance(exc, OSError)


def _crash(cause: BaseException, errlog: Any) -> str:
    """What the server said last on stderr (the launcher's line says how it ended)."""
    errlog.seek(0)
    lines = [line.strip() for line in errlog.read()[-4000:].splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith("aero-launch:")]
    ended = [
        line.removeprefix("aero-launch: ") for line in lines if line.startswith("aero-launch:")
    ]
    parts = ended[-1:] + (["its last words: " + said[-1]] if said else [])
    detail = "; ".join(parts) or f"{type(cause).__name__}: {cause}"
    return f"the server failed before it answered ({detail})"


def _clean(message: str, spec: ServerSpec) -> str:
    # Not redact_error: its opaque-token rule would hide the paths that make it clear.
    text = redact(message, _secrets(spec.secret_env.values()))
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + "…"


def _secrets(values: Iterable[str]) -> list[str]:
    return [value for value in values if value]
