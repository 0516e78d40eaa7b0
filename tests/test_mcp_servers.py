"""MCP servers as data, as an admin meets them: edited in the admin with the secret
environment write-only and encrypted (each change audited, values never), tested with
"Test / discover tools" (started with its tools and their schemas shown, or why not), and
through /api/v1/mcp/servers, /mcp/servers/test and /llm/models: admin only, every other
role refused with a problem, a proposed server tested and not kept, a retried test with
the same Idempotency-Key answered again without starting anything."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.messages import get_messages
from django.test import Client

from aero.models import AuditLog
from scenarios_admin.models import ProviderConfig
from tests.admin_helpers import admin_client, form_data, staff_with
from tests.api_helpers import call, token_for
from tools import probe
from tools.models import McpServer, McpTool

pytestmark = pytest.mark.services
CHANGELIST = "/admin/tools/mcpserver/"
FAKE = Path(__file__).resolve().with_name("fake_mcp_server.py")


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser("root", password="pw-for-tests")


def time_server(**fields: Any) -> McpServer:
    return McpServer.objects.create(
        name="time", command="{python}", args=["-m", "mcp_server_time"], **fields
    )


def press_test(client: Client, *servers: McpServer) -> list[str]:
    response = client.post(
        CHANGELIST,
        {"action": "test_servers", "_selected_action": [s.pk for s in servers]},
        follow=True,
    )
    assert response.status_code == 200
    return [str(m) for m in get_messages(response.wsgi_request)]


# --- the admin ------------------------------------------------------------------------


def test_an_admin_adds_a_server_with_a_secret_that_is_never_shown(root: User) -> None:
    client = admin_client(root)
    data = form_data(client.get(f"{CHANGELIST}add/").content.decode(), "mcpserver_form")
    data.update(
        name="search",
        command="{python}",
        args='["-m", "mcp_server_time"]',
        env='{"LOG_LEVEL": "info"}',
        secret_env="API_TOKEN=tok-very-secret-1\r\nOTHER=two",
        allowed_tools='["get_current_time"]',
    )
    response = client.post(f"{CHANGELIST}add/", data)
    assert response.status_code == 302, response.content.decode()[:3000]
    server = McpServer.objects.get(name="search")
    assert server.secret_names() == ["API_TOKEN", "OTHER"]
    assert "tok-very-secret-1" not in str(server.secret_env_encrypted)
    assert server.spec().secret_env == {"API_TOKEN": "tok-very-secret-1", "OTHER": "two"}
    page = client.get(f"{CHANGELIST}{server.pk}/change/").content.decode()
    assert "tok-very-secret-1" not in page and "API_TOKEN, OTHER" in page
    actions = list(AuditLog.objects.order_by("id").values_list("action", "detail"))
    assert ("mcp_server.secrets_changed") in [a for a, _ in actions]
    secret_entry = next(d for a, d in actions if a == "mcp_server.secrets_changed")
    assert secret_entry["names"] == ["API_TOKEN", "OTHER"]
    assert "tok-very-secret-1" not in str(actions)
    assert "mcp_server.created" in [a for a, _ in actions]

    # Saved again with the secret box empty: kept. NAME= removes one.
    data = form_data(page, "mcpserver_form")
    assert data["secret_env"] == ""
    client.post(f"{CHANGELIST}{server.pk}/change/", data)
    server.refresh_from_db()
    assert server.secret_names() == ["API_TOKEN", "OTHER"]
    data["secret_env"] = "OTHER="
    client.post(f"{CHANGELIST}{server.pk}/change/", data)
    server.refresh_from_db()
    assert server.secret_names() == ["API_TOKEN"]
    assert AuditLog.objects.filter(action="mcp_server.secrets_changed").count() == 2


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("args", '"-m mcp_server_time"', "Arguments must be a list of texts."),
        ("env", '{"1BAD": "x"}', "The environment maps names (letters, digits, _) to texts."),
        ("secret_env", "TOKEN", "Line 1 is not NAME=value"),
        ("memory_mb", "10", "greater than or equal to 64"),
    ],
)
def test_a_bad_field_is_said_and_nothing_is_saved(
    root: User, field: str, value: str, error: str
) -> None:
    client = admin_client(root)
    data = form_data(client.get(f"{CHANGELIST}add/").content.decode(), "mcpserver_form")
    data.update({"name": "x", "command": "{python}", "args": "[]", field: value})
    response = client.post(f"{CHANGELIST}add/", data)
    assert response.status_code == 200
    assert error in response.content.decode()
    assert not McpServer.objects.filter(name="x").exists()


def test_testing_a_server_lists_its_tools_with_their_schemas(root: User) -> None:
    server = time_server(allowed_tools=["get_current_time"])
    client = admin_client(root)
    assert press_test(client, server) == [
        "time: started: 2 tools: get_current_time, convert_time"  # as the server lists them
    ]
    tools = {tool.name: tool for tool in McpTool.objects.filter(server=server)}
    assert set(tools) == {"convert_time", "get_current_time"}
    assert tools["get_current_time"].input_schema["required"] == ["timezone"]
    page = client.get(f"{CHANGELIST}{server.pk}/change/").content.decode()
    assert "convert_time" in page and "source_timezone" in page  # a schema, shown
    listing = client.get(CHANGELIST).content.decode()
    assert "started: 2 tools" in listing
    entry = AuditLog.objects.get(action="mcp_server.tested")
    assert entry.detail["ok"] is True and entry.actor == root
    assert entry.detail["tools"] == ["get_current_time", "convert_time"]


def test_a_failing_server_is_answered_plainly_and_keeps_its_last_tools(
    root: User, tmp_path: Path
) -> None:
    server = time_server()
    client = admin_client(root)
    press_test(client, server)
    McpServer.objects.filter(pk=server.pk).update(command="no-such-mcp-server")
    server.refresh_from_db()
    assert press_test(client, server) == [
        "time: command not found: the command 'no-such-mcp-server' was not found"
    ]
    assert McpTool.objects.filter(server=server).count() == 2  # the last known list
    copy = tmp_path / "fake.py"
    shutil.copy(FAKE, copy)
    McpServer.objects.filter(pk=server.pk).update(command="{python}", args=[str(copy), "crash"])
    server.refresh_from_db()
    (message,) = press_test(client, server)
    assert message.startswith("time: crashed: the server failed before it answered")
    assert "the server exited with code 3" in message
    McpServer.objects.filter(pk=server.pk).update(args=[str(copy), "bad-schema"])
    server.refresh_from_db()
    (message,) = press_test(client, server)
    assert message.startswith("time: answered outside its schema or the protocol: the tool")
    outcomes = list(
        AuditLog.objects.filter(action="mcp_server.tested")
        .order_by("id")
        .values_list("detail__outcome", flat=True)
    )
    assert outcomes == ["started", "not_found", "crashed", "lying"]


def test_a_test_waits_at_most_a_minute_whatever_the_servers_timeout(
    root: User, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test answers within the admin's request: a server's calls may take ten minutes,
    its start and listing in a test at most PROBE_TIMEOUT_MAX (shortened here)."""
    monkeypatch.setattr(probe, "PROBE_TIMEOUT_MAX", 2.0)
    copy = tmp_path / "fake.py"
    shutil.copy(FAKE, copy)
    server = McpServer.objects.create(
        name="slow", command="{python}", args=[str(copy), "hang"], call_timeout_seconds=600
    )
    assert press_test(admin_client(root), server) == ["slow: timed out: no answer within 2 s"]


def test_only_admins_who_may_change_servers_test_them(
    db: None, make_user: Any, tmp_path: Path
) -> None:
    server = time_server()
    olga = admin_client(make_user("olga", "operator"))
    refused = olga.post(CHANGELIST, {"action": "test_servers", "_selected_action": [server.pk]})
    assert refused.status_code == 302 and refused["Location"].startswith("/admin/login/")
    viewer = admin_client(staff_with("vic", "view_mcpserver"))
    assert 'value="test_servers"' not in viewer.get(CHANGELIST).content.decode()
    press_test(viewer, server)
    assert not AuditLog.objects.filter(action="mcp_server.tested").exists()
    assert not McpTool.objects.exists()


# --- the API -------------------------------------------------------------------------


def test_the_servers_with_their_tools_for_admins_only(root: User, make_user: Any) -> None:
    server = time_server(allowed_tools=["get_current_time"])
    server.update_secret_env({"TOKEN": "tok-never-answered"})
    server.save()
    press_test(admin_client(root), server)
    response = call("GET", "/api/v1/mcp/servers", token_for(root, "admin"))
    assert response.status_code == 200
    body = response.json()
    (listed,) = [s for s in body["servers"] if s["name"] == "time"]
    assert listed["secret_env_names"] == ["TOKEN"]
    assert "tok-never-answered" not in response.content.decode()
    assert {t["name"]: t["allowed"] for t in listed["tools"]} == {
        "convert_time": False,
        "get_current_time": True,
    }
    assert listed["last_test_outcome"] == "started"
    for role in ("operator", "approver", "auditor"):
        user = make_user(f"u-{role}", role)
        refused = call("GET", "/api/v1/mcp/servers", token_for(user, role))
        assert refused.status_code == 403
        assert refused["Content-Type"] == "application/problem+json"
        assert "manage tool servers" in refused.json()["detail"]
    assert call("GET", "/api/v1/mcp/servers").status_code == 401


def test_the_servers_page_with_a_cursor(root: User) -> None:
    for name in ("a-one", "b-two", "c-three"):
        McpServer.objects.create(name=name, command="{python}")
    token = token_for(root, "admin")
    first = call("GET", "/api/v1/mcp/servers?limit=2", token).json()
    names = [s["name"] for s in first["servers"]]
    second = call("GET", f"/api/v1/mcp/servers?limit=2&cursor={first['next_cursor']}", token)
    names += [s["name"] for s in second.json()["servers"]]
    assert names == sorted(McpServer.objects.values_list("name", flat=True))
    assert call("GET", "/api/v1/mcp/servers?cursor=bad", token).status_code == 404


def test_testing_a_configured_server_through_the_api_keeps_its_tools(root: User) -> None:
    server = time_server()
    token = token_for(root, "admin")
    response = call("POST", "/api/v1/mcp/servers/test", token, {"server_id": server.pk})
    assert response.status_code == 200
    body = response.json()
    assert (body["ok"], body["outcome"], body["server_id"]) == (True, "started", server.pk)
    assert body["message"] == "2 tools: get_current_time, convert_time"
    assert McpTool.objects.filter(server=server).count() == 2
    missing = call("POST", "/api/v1/mcp/servers/test", token, {"server_id": 999999})
    assert missing.status_code == 404 and "No MCP server 999999" in missing.json()["detail"]


def test_a_proposed_server_is_tested_and_not_kept(root: User, tmp_path: Path) -> None:
    token = token_for(root, "admin")
    before = McpServer.objects.count()
    proposed = {"command": "{python}", "args": ["-m", "mcp_server_time"], "name": "maybe"}
    body = call("POST", "/api/v1/mcp/servers/test", token, {"definition": proposed}).json()
    assert body["ok"] is True and body["server_id"] is None
    assert {t["name"] for t in body["tools"]} == {"convert_time", "get_current_time"}
    assert McpServer.objects.count() == before and not McpTool.objects.exists()

    copy = tmp_path / "fake.py"
    shutil.copy(FAKE, copy)
    hung = {
        "command": "{python}",
        "args": [str(copy), "hang"],
        "call_timeout_seconds": 2,
        "secret_env": {"TOKEN": "tok-proposed-secret"},
    }
    response = call("POST", "/api/v1/mcp/servers/test", token, {"definition": hung})
    answer = response.json()
    assert (answer["ok"], answer["outcome"]) == (False, "timed_out")
    assert answer["message"] == "no answer within 2 s"
    entry = AuditLog.objects.filter(action="mcp_server.tested").latest("id")
    assert entry.detail["proposed"]["secret_env_names"] == ["TOKEN"]
    assert "tok-proposed-secret" not in str(entry.detail)
    assert McpServer.objects.count() == before


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "give either server_id or definition"),
        ({"server_id": 1, "definition": {"command": "x"}}, "give either server_id or definition"),
        ({"definition": {"command": ""}}, "command"),
        ({"definition": {"command": "x", "call_timeout_seconds": 600}}, "call_timeout_seconds"),
        ({"definition": {"command": "x", "env": {"1BAD": "x"}}}, "env"),
        ({"definition": {"command": "x", "shell": True}}, "shell"),
    ],
)
def test_a_bad_test_request_is_refused_and_nothing_runs(
    root: User, body: dict[str, Any], says: str
) -> None:
    response = call("POST", "/api/v1/mcp/servers/test", token_for(root, "admin"), body)
    assert response.status_code == 422
    assert says in response.content.decode()
    assert not AuditLog.objects.filter(action="mcp_server.tested").exists()


def test_a_retried_test_with_its_key_answers_again_without_starting_anything(
    root: User,
) -> None:
    server = time_server()
    token = token_for(root, "admin")
    headers = {"Idempotency-Key": "test-time-1"}
    body = {"server_id": server.pk}
    first = call("POST", "/api/v1/mcp/servers/test", token, body, headers)
    McpServer.objects.filter(pk=server.pk).update(command="no-such-mcp-server")
    again = call("POST", "/api/v1/mcp/servers/test", token, body, headers)
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert AuditLog.objects.filter(action="mcp_server.tested").count() == 1
    other = call("POST", "/api/v1/mcp/servers/test", token, {"server_id": 999}, headers)
    assert other.status_code == 422


def test_the_model_providers_without_their_keys(root: User, make_user: Any) -> None:
    local = ProviderConfig.objects.create(name="local", kind="offline", priority=200)
    remote = ProviderConfig(
        name="remote",
        kind="openai",
        base_url="https://user:pw-in-url@llm.example.com/v1",
        model="gpt-4o-mini",
        priority=10,
    )
    remote.set_api_key("sk-never-answered-123")
    remote.save()
    response = call("GET", "/api/v1/llm/models", token_for(root, "admin"))
    assert response.status_code == 200
    models = response.json()["models"]
    assert [m["name"] for m in models] == ["remote", "local"]
    assert models[0]["model"] == "gpt-4o-mini" and models[0]["api_key_set"] is True
    assert models[0]["base_url"] == "https://llm.example.com/v1"
    assert models[1]["kind"] == "offline" and models[1]["api_key_set"] is False
    text = response.content.decode()
    assert "sk-never-answered-123" not in text and "pw-in-url" not in text
    assert local.pk == models[1]["id"]
    user = make_user("olga", "operator")
    refused = call("GET", "/api/v1/llm/models", token_for(user, "operator"))
    assert refused.status_code == 403


def test_the_operations_are_in_the_openapi_document(db: None) -> None:
    schema = Client().get("/api/v1/openapi.json").json()
    paths = schema["paths"]
    assert paths["/api/v1/mcp/servers"]["get"]["operationId"] == "listMcpServers"
    test = paths["/api/v1/mcp/servers/test"]["post"]
    assert test["operationId"] == "testMcpServer"
    assert "Idempotency-Key" in [p["name"] for p in test["parameters"]]
    assert paths["/api/v1/llm/models"]["get"]["operationId"] == "listLlmModels"
    assert "403" in test["responses"]
