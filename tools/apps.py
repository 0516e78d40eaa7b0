from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ToolsConfig(AppConfig):
    name = "tools"
    verbose_name = _("Tool servers (MCP)")

    def ready(self) -> None:
        from aero import audit_trail
        from tools.models import McpServer

        audit_trail.connect_secrets(McpServer)
