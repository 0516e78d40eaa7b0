"""MCP tool servers as data: how to start each (command, arguments, environment with its
secrets encrypted), which of its tools may be called, the limits of each exchange, and
the tools it listed when last tested (`McpTool`)."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from aero import crypto
from tools.client import ServerSpec
from tools.names import SKILL_TOOL_PREFIX

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


RISK_CLASSES = ("R0", "R1", "R2", "R3")


class Skill(models.Model):
    """An uploaded skill: a script run as an evidence tool in a sandbox (tools.sandbox).
    Its versions are kept; the active one is what runs. The risk class is the active
    version's manifest's, never below R0."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=500, blank=True)
    risk_class = models.CharField(
        max_length=2, default="R0", choices=[(r, r) for r in RISK_CLASSES], editable=False
    )
    active_version = models.ForeignKey(
        "SkillVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text=_("The version that runs; none: the skill is not offered."),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("skill")
        verbose_name_plural = _("skills")

    def __str__(self) -> str:
        return self.name


class SkillVersion(models.Model):
    """One uploaded zip of a skill, checked (tools.skills) and immutable."""

    skill = models.ForeignKey(Skill, on_delete=models.CASCADE, related_name="versions")
    version = models.CharField(max_length=64)
    description = models.CharField(max_length=500, blank=True)
    manifest = models.JSONField(default=dict)
    arguments_schema = models.JSONField(default=dict)
    result_schema = models.JSONField(default=dict)
    entry = models.CharField(max_length=255)
    risk_class = models.CharField(max_length=2, default="R0")
    # The problem types it applies to (empty: none is chosen for it automatically).
    applies_to = models.JSONField(default=list, blank=True)
    sha256 = models.CharField(max_length=64, help_text=_("Of the uploaded zip."))
    size = models.PositiveIntegerField(default=0)
    uploaded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    uploaded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["skill", "-uploaded_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["skill", "version"], name="skill_version_unique")
        ]
        verbose_name = _("skill version")
        verbose_name_plural = _("skill versions")

    def __str__(self) -> str:
        return f"{self.skill.name} {self.version}"

    @property
    def tool_name(self) -> str:
        return f"{SKILL_TOOL_PREFIX}{self.skill.name}"


class SkillFile(models.Model):
    """A file of a skill version, its bytes kept in the database (a skill is small:
    tools.skills.LIMITS) so every worker reads the same."""

    version = models.ForeignKey(SkillVersion, on_delete=models.CASCADE, related_name="files")
    path = models.CharField(max_length=255)
    size = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    content = models.BinaryField()

    class Meta:
        ordering = ["version", "path"]
        constraints = [
            models.UniqueConstraint(fields=["version", "path"], name="skill_file_unique")
        ]

    def __str__(self) -> str:
        return self.path
