"""The reference MCP git server as a configured server named "git": the diagnosis code
tool's, with `{repo}` filled with the session's bundle repository. Read-only tools only:
the code tool reads diffs and files, and nothing may commit, reset or check out."""

from __future__ import annotations

from typing import Any

from django.db import migrations

READ_ONLY_GIT_TOOLS = ["git_status", "git_diff", "git_log", "git_show", "git_branch"]


def add_git(apps: Any, schema_editor: Any) -> None:
    server = apps.get_model("tools", "McpServer")
    server.objects.get_or_create(
        name="git",
        defaults={
            "description": "The reference MCP git server (mcp-server-git) over a session's repository.",
            "command": "{python}",
            "args": ["-m", "mcp_server_git", "--repository", "{repo}"],
            "allowed_tools": READ_ONLY_GIT_TOOLS,
            "call_timeout_seconds": 30.0,
            "memory_mb": 512,
            "cpu_seconds": 30,
        },
    )


class Migration(migrations.Migration):
    dependencies = [("tools", "0001_initial")]
    operations = [migrations.RunPython(add_git, migrations.RunPython.noop)]
