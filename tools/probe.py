"""Testing a server: start it, list its tools, stop it, and say plainly what happened.
A configured server's tools are kept (`McpTool`) and the test is audited; a proposed
definition (the API's) is tested the same way and nothing is kept."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.db import transaction
from django.utils import timezone

from aero.models import audit
from tools.client import McpError, ServerSpec, ToolInfo, discover
from tools.models import McpServer, McpTool

NAMES_SHOWN = 8
# A test answers within a request (the admin's page, the API's call): a server gets at
# most this long to start and list its tools, whatever its calls' timeout.
PROBE_TIMEOUT_MAX = 60.0


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    outcome: str  # started, or McpError's outcome
    message: str
    tools: list[ToolInfo]


def probe_spec(spec: ServerSpec) -> ProbeResult:
    if spec.timeout > PROBE_TIMEOUT_MAX:
        spec = replace(spec, timeout=PROBE_TIMEOUT_MAX)
    try:
        tools = discover(spec)
    except McpError as exc:
        return ProbeResult(False, exc.outcome, str(exc), [])
    names = [tool.name for tool in tools]
    listed = ", ".join(names[:NAMES_SHOWN]) + (", …" if len(names) > NAMES_SHOWN else "")
    message = f"{len(tools)} tool{'s' if len(tools) != 1 else ''}" + (
        f": {listed}" if names else ""
    )
    unknown = [name for name in spec.allowed_tools if name not in names]
    if unknown:
        message += f" (allowed but not listed: {', '.join(unknown)})"
    return ProbeResult(True, "started", message, tools)


def probe_server(server: McpServer, actor: Any) -> ProbeResult:
    """Test a configured server: its tools replace the ones it listed before (a failed
    test keeps them: the last known list); the outcome is stored and audited."""
    try:
        spec = server.spec()
    except ValueError as exc:  # a secret the configured keys cannot decrypt
        result = ProbeResult(False, "refused", str(exc), [])
    else:
        result = probe_spec(spec)
    now = timezone.now()
    with transaction.atomic():
        if result.ok:
            McpTool.objects.filter(server=server).exclude(
                name__in=[tool.name for tool in result.tools]
            ).delete()
            for tool in result.tools:
                McpTool.objects.update_or_create(
                    server=server,
                    name=tool.name,
                    defaults={
                        "description": tool.description,
                        "input_schema": tool.input_schema,
                        "output_schema": tool.output_schema,
                        "discovered_at": now,
                    },
                )
        McpServer.objects.filter(pk=server.pk).update(
            last_tested_at=now,
            last_test_outcome=result.outcome,
            last_test_message=result.message[:500],
        )
        audit(
            "mcp_server.tested",
            obj=server,
            actor=actor,
            detail={
                "ok": result.ok,
                "outcome": result.outcome,
                "message": result.message,
                "tools": [tool.name for tool in result.tools],
            },
        )
    server.last_tested_at, server.last_test_outcome = now, result.outcome
    server.last_test_message = result.message[:500]
    return result
