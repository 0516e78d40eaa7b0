"""`/api/v1/mcp/servers`, `/mcp/servers/test` and `/llm/models` (seed 003 §4.1.4): the
configured MCP servers with the tools they listed, a test of one (configured, or proposed
and not saved) with the same clear answer as the admin's action, and the configured model
providers. Admin only: servers run commands and both hold credentials (never answered)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from django.db.models import Prefetch, Q
from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Schema, Status
from pydantic import StringConstraints, model_validator

from aero.models import audit
from aero.roles import MANAGE_TOOLS
from api import idempotency, pagination
from api.auth import TokenAuth
from api.errors import READ_ERRORS, WRITE_ERRORS, ApiError
from api.schemas import NO_NUL, StrictIn
from api.strict import StrictRouter
from scenarios_admin.models import ProviderConfig
from tools.client import ServerSpec
from tools.models import ENV_NAME, McpServer, McpTool
from tools.probe import PROBE_TIMEOUT_MAX, ProbeResult, probe_server, probe_spec

ADMIN = TokenAuth(MANAGE_TOOLS, "manage tool servers and model providers")
router = StrictRouter(tags=["tools"])
LIST_MAX = 100
# A test answers within the request: a proposed server gets at most this long.
TEST_TIMEOUT_MAX = PROBE_TIMEOUT_MAX

Arg = Annotated[str, StringConstraints(max_length=1000, pattern=NO_NUL)]
Value = Annotated[str, StringConstraints(max_length=4000, pattern=NO_NUL)]
EnvName = Annotated[str, StringConstraints(max_length=100, pattern=ENV_NAME)]
ToolName = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=NO_NUL)]


class McpToolOut(Schema):
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    allowed: bool = Field(..., description="Whether AERO may call it (the server's allowed tools).")
    discovered_at: datetime | None


class McpServerOut(Schema):
    id: int
    name: str
    description: str
    command: str
    args: list[str]
    env: dict[str, str]
    secret_env_names: list[str] = Field(..., description="Names only: values are never answered.")
    allowed_tools: list[str]
    call_timeout_seconds: float
    memory_mb: int
    cpu_seconds: int
    enabled: bool
    last_tested_at: datetime | None
    last_test_outcome: str
    last_test_message: str
    tools: list[McpToolOut]


class McpServerPage(Schema):
    servers: list[McpServerOut]
    next_cursor: str | None


class McpServerDefinitionIn(StrictIn):
    name: str = Field("proposed", max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
    command: str = Field(
        ...,
        min_length=1,
        max_length=500,
        pattern=NO_NUL,
        description="The executable; {python} is the interpreter AERO runs on.",
    )
    args: list[Arg] = Field(default_factory=list, max_length=100)
    env: dict[EnvName, Value] = Field(default_factory=dict)
    secret_env: dict[EnvName, Value] = Field(
        default_factory=dict, description="Passed to the server, never stored nor answered."
    )
    allowed_tools: list[ToolName] = Field(default_factory=list, max_length=200)
    call_timeout_seconds: float = Field(30.0, ge=1.0, le=TEST_TIMEOUT_MAX)
    memory_mb: int = Field(512, ge=64, le=16384)
    cpu_seconds: int = Field(30, ge=1, le=3600)


class McpServerTestIn(StrictIn):
    server_id: int | None = Field(
        None, ge=1, le=2**31 - 1, description="A configured server (its tools are kept)."
    )
    definition: McpServerDefinitionIn | None = Field(
        None, description="A proposed server, tested and not saved."
    )

    @model_validator(mode="after")
    def one_of_them(self) -> McpServerTestIn:
        if (self.server_id is None) == (self.definition is None):
            raise ValueError("give either server_id or definition (one of them)")
        return self


class DiscoveredToolOut(Schema):
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None


class McpServerTestOut(Schema):
    ok: bool
    outcome: str = Field(
        ...,
        description="started, not_found (no such command), crashed, timed_out, lying "
        "(an answer breaking its schema or the protocol) or refused.",
    )
    message: str
    server_id: int | None
    tools: list[DiscoveredToolOut]


class ModelOut(Schema):
    id: int
    name: str
    kind: str
    model: str
    base_url: str
    api_key_set: bool = Field(..., description="Whether a key is stored (never the key).")
    priority: int
    enabled: bool
    timeout_seconds: float
    retries: int
    price_input_per_1k: Decimal
    price_output_per_1k: Decimal


class ModelPage(Schema):
    models: list[ModelOut]
    next_cursor: str | None


def without_userinfo(url: str) -> str:
    """A base URL as shown: credentials written into it (user:password@) are not."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def server_out(server: McpServer) -> dict[str, Any]:
    return {
        **{
            name: getattr(server, name)
            for name in (
                "id",
                "name",
                "description",
                "command",
                "args",
                "env",
                "allowed_tools",
                "call_timeout_seconds",
                "memory_mb",
                "cpu_seconds",
                "enabled",
                "last_tested_at",
                "last_test_outcome",
                "last_test_message",
            )
        },
        "secret_env_names": server.secret_names(),
        "tools": [
            {
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.input_schema,
                "output_schema": tool.output_schema,
                "allowed": not server.allowed_tools or tool.name in server.allowed_tools,
                "discovered_at": tool.discovered_at,
            }
            for tool in server.tools.all()
        ],
    }


@router.get("/mcp/servers", auth=ADMIN, response={200: McpServerPage, **READ_ERRORS})
def list_mcp_servers(
    request: HttpRequest,
    limit: int = Query(50, ge=1, le=LIST_MAX),
    cursor: str = pagination.cursor_query(),
) -> Any:
    """The configured MCP servers by name, each with the tools it listed when last tested
    and their schemas; secret variables by name only."""
    servers = McpServer.objects.prefetch_related(
        Prefetch("tools", queryset=McpTool.objects.order_by("name"))
    ).order_by("name")
    if cursor:
        after = pagination.decode("mcp-servers", cursor).get("name")
        if not isinstance(after, str):
            raise ApiError(404, "invalid_cursor", "No such page: start again.")
        servers = servers.filter(name__gt=after)
    page = list(servers[: limit + 1])
    shown = page[:limit]
    return {
        "servers": [server_out(server) for server in shown],
        "next_cursor": (
            pagination.encode("mcp-servers", {"name": shown[-1].name})
            if len(page) > limit
            else None
        ),
    }


def _result(result: ProbeResult, server_id: int | None) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "outcome": result.outcome,
        "message": result.message,
        "server_id": server_id,
        "tools": [
            {
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.input_schema,
                "output_schema": tool.output_schema,
            }
            for tool in result.tools
        ],
    }


@router.post("/mcp/servers/test", auth=ADMIN, response={200: McpServerTestOut, **WRITE_ERRORS})
def test_mcp_server(
    request: HttpRequest,
    response: HttpResponse,
    payload: McpServerTestIn,
    idempotency_key: str | None = idempotency.key_header(
        "Retry safely: the same key and body answer the first test again (24 h) without "
        "starting the server."
    ),
) -> Any:
    """Start the server, list its tools and stop it: `ok` and `outcome` say what happened,
    `message` says it in words. A configured server (`server_id`) keeps the tools it
    listed and its last test, as the admin's test does; a proposed `definition` is tested
    and nothing of it is kept. Audited either way (never the secret values)."""
    sent = payload.model_dump()

    def run() -> tuple[int, dict[str, Any]]:
        if payload.server_id is not None:
            server = McpServer.objects.filter(pk=payload.server_id).first()
            if server is None:
                raise ApiError(404, "not_found", f"No MCP server {payload.server_id}.")
            return 200, _result(probe_server(server, request.user), server.pk)
        definition = payload.definition
        assert definition is not None  # one_of_them
        spec = ServerSpec(
            name=definition.name,
            command=definition.command,
            args=list(definition.args),
            env=dict(definition.env),
            secret_env=dict(definition.secret_env),
            allowed_tools=list(definition.allowed_tools),
            timeout=definition.call_timeout_seconds,
            memory_mb=definition.memory_mb,
            cpu_seconds=definition.cpu_seconds,
        )
        result = probe_spec(spec)
        audit(
            "mcp_server.tested",
            object_type="tools.mcpserver",
            actor=request.user,
            detail={
                "proposed": {
                    "name": spec.name,
                    "command": spec.command,
                    "args": spec.args,
                    "secret_env_names": sorted(spec.secret_env),
                },
                "ok": result.ok,
                "outcome": result.outcome,
                "message": result.message,
                "tools": [tool.name for tool in result.tools],
            },
        )
        return 200, _result(result, None)

    status, body = idempotency.answer_once(request, response, idempotency_key, sent, run)
    return Status(status, body)


@router.get("/llm/models", auth=ADMIN, response={200: ModelPage, **READ_ERRORS})
def list_llm_models(
    request: HttpRequest,
    limit: int = Query(50, ge=1, le=LIST_MAX),
    cursor: str = pagination.cursor_query(),
) -> Any:
    """The configured model providers in the order they are tried (priority, then name):
    kind, model, base URL and whether a key is stored; never the key."""
    providers = ProviderConfig.objects.order_by("priority", "name")
    if cursor:
        after = pagination.decode("llm-models", cursor)
        priority, name = after.get("priority"), after.get("name")
        if not isinstance(priority, int) or not isinstance(name, str):
            raise ApiError(404, "invalid_cursor", "No such page: start again.")
        providers = providers.filter(Q(priority__gt=priority) | Q(priority=priority, name__gt=name))
    page = list(providers[: limit + 1])
    shown = page[:limit]
    return {
        "models": [
            {
                "id": p.pk,
                "name": p.name,
                "kind": p.kind,
                "model": p.model,
                "base_url": without_userinfo(p.base_url),
                "api_key_set": bool(p.api_key_encrypted),
                "priority": p.priority,
                "enabled": p.enabled,
                "timeout_seconds": p.timeout_seconds,
                "retries": p.retries,
                "price_input_per_1k": p.price_input_per_1k,
                "price_output_per_1k": p.price_output_per_1k,
            }
            for p in shown
        ],
        "next_cursor": (
            pagination.encode(
                "llm-models", {"priority": shown[-1].priority, "name": shown[-1].name}
            )
            if len(page) > limit
            else None
        ),
    }
