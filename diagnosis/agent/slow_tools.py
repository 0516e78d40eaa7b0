"""Slow tools are waits, like model calls (docs/model-calls.md): a tool that talks to
another system (a metrics source over HTTP, an MCP server, a skill) is declared slow
once, and a graph node calls it through `call_slow`. Inside a node with waits on
(AERO_LLM_WAITS) the call is looked up by its key, `tool:<session>:<tool>:<args digest>`:

- answered (an `LLMRequest` row the runner finished): its stored result is returned, or
  `SlowToolFailed` with the stored reason (a failure or a timeout fails this call only);
- not yet: `ToolWait` is raised. It is a `ModelWait`, so the node wrapper turns it into
  the same LangGraph interrupt, the job records the request row (fenced by its lease)
  and ends, the reconciler leaves the session alone while the row is pending, and the
  LLM runner claims it, runs the tool on a thread of its own under the tool's timeout,
  stores the result with a `tool.slow_call` event (once, under its claim) and enqueues
  the session. A runner killed mid-call loses its claim; another one runs the call again
  (recorded means finished).

Without waits (the inline backend, the CLI) the tool runs here, in the step.

A pack declares its slow tools with `register_slow_tool` (AppConfig.ready()); the
arguments are stored in the request, so they must be JSON and hold no secret (a tool
reads its credentials from its configuration by name when it runs)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections

from diagnosis.agent import waits
from diagnosis.models import LLMRequest, LLMRequestStatus

WAIT_KIND = "tool"
# Interrupts whose answer is a request row (`LLMRequest`), or rows (the children of a
# wait for child agents, diagnosis.agent.child_agents): the job waits for each alike.
REQUEST_WAIT_KINDS = ("model", WAIT_KIND, "children")


class SlowToolFailed(RuntimeError):
    """The slow tool failed, timed out or is unknown: the message says why."""


@dataclass(frozen=True)
class SlowTool:
    """One declaration: what runs (args -> a JSON result; raises to fail) and how long
    the runner lets one call take (from its arguments: a source's own timeout, say)."""

    name: str
    run: Callable[[dict[str, Any]], dict[str, Any]]
    timeout: Callable[[dict[str, Any]], float]


_TOOLS: dict[str, SlowTool] = {}


def register_slow_tool(
    name: str,
    run: Callable[[dict[str, Any]], dict[str, Any]],
    timeout: float | Callable[[dict[str, Any]], float],
) -> SlowTool:
    """Declare a slow tool (from a pack's AppConfig.ready(); registering again replaces
    it: ready() may run twice in tests)."""
    limit = timeout if callable(timeout) else (lambda args, seconds=float(timeout): seconds)
    tool = SlowTool(name, run, limit)
    _TOOLS[name] = tool
    return tool


def slow_tool(name: str) -> SlowTool:
    try:
        return _TOOLS[name]
    except KeyError:
        raise SlowToolFailed(f"no slow tool named {name} is declared") from None


def tool_key(session_id: Any, name: str, args: dict[str, Any]) -> str:
    """The same call in the same session has the same key, whichever step makes it."""
    digest = hashlib.sha256(
        json.dumps(args, sort_keys=True, ensure_ascii=False, default=str).encode()
    ).hexdigest()[:24]
    return f"tool:{session_id}:{name}:{digest}"


def tool_request(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The request row's body for a slow tool call (a model request's holds messages)."""
    return {"slow_tool": name, "args": args}


def is_tool_request(request: dict[str, Any]) -> bool:
    return "slow_tool" in request


class ToolWait(waits.ModelWait):
    """The node must wait for a slow tool: handled exactly as a model wait."""


def call_slow(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The tool's result. In a node with waits on: the runner's stored result, or
    ToolWait until there is one. Otherwise the tool runs here. Any failure: SlowToolFailed."""
    scope = waits.current_scope()
    if scope is None:
        return run_tool(name, args)
    key = tool_key(scope.session_id, name, args)
    row = _answered_row(key)
    if row is not None and row.status == LLMRequestStatus.DONE:
        return dict((row.reply or {}).get("result") or {})
    if row is not None and row.status == LLMRequestStatus.FAILED:
        raise SlowToolFailed(row.error or f"{name} failed")
    raise ToolWait(
        {
            "kind": WAIT_KIND,
            "key": key,
            "purpose": f"tool:{name}"[:32],
            "providers": [],
            "request": tool_request(name, args),
        }
    )


def _answered_row(key: str) -> LLMRequest | None:
    kept = waits.answered_row(key)
    if kept is not None:
        return kept
    return LLMRequest.objects.filter(key=key).only("key", "status", "reply", "error").first()


def run_tool(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run the tool now (the runner's thread, or a step without waits); its failure as
    SlowToolFailed with the tool's own words."""
    tool = slow_tool(name)
    try:
        return tool.run(args)
    except SlowToolFailed:
        raise
    except Exception as exc:
        raise SlowToolFailed(str(exc) or type(exc).__name__) from None


def run_in_thread(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """run_tool on a runner's thread: its database connections (a tool may read its
    configuration) are closed when the call ends, as the thread's owner never will."""
    try:
        return run_tool(name, args)
    finally:
        connections.close_all()
