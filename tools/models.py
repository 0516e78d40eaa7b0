"""MCP tool servers as data: how to start each (command, arguments, environment with its
secrets encrypted), which of its tools may be called, the limits of each exchange, and
the tools it listed when last tested (`McpTool`)."""

from __future__ import annotations

import re
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from aero import crypto
from tools.client import ServerSpec

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def _strings(value: Any, what: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValidationError(_("%(what)s must be a list of texts.") % {"what": what})


def validate_args(value: Any) -> None:
    _strings(value, _("Arguments"))


def validate_tools(value: Any) -> None:
    _strings(value, _("Allowed tools"))


def validate_env(value: Any) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and re.match(ENV_NAME, k) and isinstance(v, str)
        for k, v in value.items()
    ):
        raise ValidationError(
            _("The environment maps names (letters, digits, _) to texts."), code="env"
        )


class McpServer(models.Model):
    """One MCP server. Each exchange starts it in a process of its own under these
    limits (tools.client); `{python}` as the command is AERO's own interpreter, and an
    argument may hold a placeholder its caller fills (the code tool's `{repo}`)."""

    name = models.SlugField(max_length=64, unique=True, help_text=_("How tools find it, e.g. git."))
    description = models.CharField(max_length=300, blank=True)
    command = models.CharField(
        max_length=500, help_text=_("The executable; {python} is the interpreter AERO runs on.")
    )
    args = models.JSONField(default=list, blank=True, validators=[validate_args])
    env = models.JSONField(default=dict, blank=True, validators=[validate_env])
    # Secret variables: name -> Fernet token (aero.crypto); never rendered back.
    secret_env_encrypted = models.JSONField(default=dict, blank=True, editable=False)
    allowed_tools = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_tools],
        help_text=_("The tools AERO may call; empty: every tool the server lists."),
    )
    call_timeout_seconds = models.FloatField(
        default=30.0, validators=[MinValueValidator(1.0), MaxValueValidator(600.0)]
    )
    memory_mb = models.PositiveIntegerField(
        default=512,
        validators=[MinValueValidator(64), MaxValueValidator(16384)],
        help_text=_("Address space of the server's process, in MB."),
    )
    cpu_seconds = models.PositiveIntegerField(
        default=30,
        validators=[MinValueValidator(1), MaxValueValidator(3600)],
        help_text=_("CPU time of the server's process per exchange, in seconds."),
    )
    enabled = models.BooleanField(default=True)
    last_tested_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_test_outcome = models.CharField(max_length=16, blank=True, editable=False)
    last_test_message = models.CharField(max_length=500, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("MCP server")
        verbose_name_plural = _("MCP servers")

    def __str__(self) -> str:
        return self.name

    def update_secret_env(self, entered: dict[str, str], *, clear: bool = False) -> None:
        """Set the secret variables entered (a name with an empty value removes it), the
        others kept unless `clear`."""
        current = {} if clear else dict(self.secret_env_encrypted)
        for name, value in entered.items():
            if value:
                current[name] = crypto.encrypt(value)
            else:
                current.pop(name, None)
        self.secret_env_encrypted = current

    def secret_env(self) -> dict[str, str]:
        return {name: crypto.decrypt(token) for name, token in self.secret_env_encrypted.items()}

    def secret_names(self) -> list[str]:
        return sorted(self.secret_env_encrypted)

    def spec(self) -> ServerSpec:
        return ServerSpec(
            name=self.name,
            command=self.command,
            args=list(self.args),
            env=dict(self.env),
            secret_env=self.secret_env(),
            allowed_tools=list(self.allowed_tools),
            timeout=self.call_timeout_seconds,
            memory_mb=self.memory_mb,
            cpu_seconds=self.cpu_seconds,
        )


class McpTool(models.Model):
    """A tool a server listed when it was last tested, with its schemas."""

    server = models.ForeignKey(McpServer, on_delete=models.CASCADE, related_name="tools")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    output_schema = models.JSONField(null=True, blank=True)
    discovered_at = models.DateTimeField()

    class Meta:
        ordering = ["server", "name"]
        constraints = [
            models.UniqueConstraint(fields=["server", "name"], name="mcp_tool_unique_per_server")
        ]

    def __str__(self) -> str:
        return f"{self.server_id}:{self.name}"

    @property
    def allowed(self) -> bool:
        return not self.server.allowed_tools or self.name in self.server.allowed_tools
