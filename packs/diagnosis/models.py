"""The diagnosis pack's knowledge base: past incidents (shipped with the demo shop, added
by admins, or saved from a completed session) and the links a concluded session keeps to
the ones most like it (knowledge.py searches them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

from aero import crypto
from diagnosis.models import Session
from packs.diagnosis.prometheus import PrometheusSource
from packs.diagnosis.system import demo_shop


class KnowledgeSource(models.TextChoices):
    SHIPPED = "shipped", _("Shipped with the system")
    ADMIN = "admin", _("Written by an admin")
    SESSION = "session", _("Saved from a session")
    API = "api", _("Written through the API")


class KnowledgeItem(models.Model):
    # The id people cite: the shipped items keep demo_shop.yaml's ("KB-003").
    key = models.CharField(_("id"), max_length=40, unique=True)
    title_zh = models.CharField(_("title (Chinese)"), max_length=200, blank=True)
    title_en = models.CharField(_("title (English)"), max_length=200, blank=True)
    problem_type = models.CharField(_("problem type"), max_length=40, blank=True)
    hypothesis = models.CharField(_("root cause kind"), max_length=40, blank=True)
    services = models.JSONField(_("services"), default=list, blank=True)
    symptoms_zh = models.TextField(_("symptoms (Chinese)"), blank=True)
    symptoms_en = models.TextField(_("symptoms (English)"), blank=True)
    root_cause_zh = models.TextField(_("root cause (Chinese)"), blank=True)
    root_cause_en = models.TextField(_("root cause (English)"), blank=True)
    fix_zh = models.TextField(_("fix (Chinese)"), blank=True)
    fix_en = models.TextField(_("fix (English)"), blank=True)
    tags = models.JSONField(_("tags"), default=list, blank=True)
    source = models.CharField(
        _("source"), max_length=10, choices=KnowledgeSource.choices, default=KnowledgeSource.ADMIN
    )
    # The session it was saved from: a session is saved once.
    session = models.OneToOneField(
        Session,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="knowledge_item",
        verbose_name=_("session"),
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Every searchable word of the item in one column, written by save(): what the
    # full-text and trigram indexes cover (migration 0002 makes them).
    search_text = models.TextField(editable=False, default="")

    class Meta:
        ordering = ["key"]
        verbose_name = _("knowledge item")
        verbose_name_plural = _("knowledge items")

    def __str__(self) -> str:
        return f"{self.key} {self.title_en or self.title_zh}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        self.search_text = self.searchable()
        fields = kwargs.get("update_fields")
        if fields is not None:
            kwargs["update_fields"] = {*fields, "search_text"}
        super().save(*args, **kwargs)

    def clean(self) -> None:
        # The search and the pages read both as lists of words.
        errors = {
            name: ValidationError(_('A list of words, e.g. ["inventory", "orders"].'))
            for name in ("services", "tags")
            if not isinstance(getattr(self, name), list)
            or not all(isinstance(v, str) and v.strip() for v in getattr(self, name))
        }
        if errors:
            raise ValidationError(errors)

    def text(self, name: str, language: str) -> str:
        """A text field in `language`, else in the other one (shipped items have one)."""
        first, second = ("zh", "en") if language == "zh" else ("en", "zh")
        return str(getattr(self, f"{name}_{first}") or getattr(self, f"{name}_{second}"))

    def written_in(self, language: str) -> str:
        """The language `text` shows the item in for a `language` reader ("zh"/"en")."""
        other = "en" if language == "zh" else "zh"
        return language if getattr(self, f"title_{language}") else other

    def searchable(self) -> str:
        parts: list[Any] = [
            self.key,
            self.title_zh,
            self.title_en,
            self.problem_type,
            self.hypothesis,
            " ".join(str(s) for s in self.services),
            " ".join(str(t) for t in self.tags),
            self.symptoms_zh,
            self.symptoms_en,
            self.root_cause_zh,
            self.root_cause_en,
            self.fix_zh,
            self.fix_en,
        ]
        return "\n".join(str(p) for p in parts if p)


class SimilarCase(models.Model):
    """A knowledge item found like a concluded session, with the score and the strategy
    (which search found it) it was found by; written with the `diagnosis.similar_cases`
    event."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="similar_cases")
    item = models.ForeignKey(KnowledgeItem, on_delete=models.CASCADE, related_name="links")
    score = models.FloatField()
    strategy = models.CharField(max_length=40)
    rank = models.PositiveSmallIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["session", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["session", "item"], name="similar_case_once"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} ~ {self.item_id} ({self.score:.2f})"


class MetricsAuth(models.TextChoices):
    NONE = "none", _("None")
    BASIC = "basic", _("Basic auth (user name and password)")
    BEARER = "bearer", _("Bearer token")


class MetricsSource(models.Model):
    """A system's live metrics (issue 36 item 1): a Prometheus base URL, its credentials
    (encrypted, write-only: aero/crypto.py), a timeout per request and the query step.
    A diagnosis session reads its metrics from one of these or from its bundle."""

    name = models.SlugField(_("name"), max_length=60, unique=True)
    base_url = models.URLField(
        _("Prometheus base URL"),
        max_length=300,
        help_text=_("Without /api/v1, e.g. http://prometheus:9090"),
    )
    auth = models.CharField(
        _("authentication"), max_length=10, choices=MetricsAuth.choices, default=MetricsAuth.NONE
    )
    username = models.CharField(_("user name"), max_length=120, blank=True)
    # The password (basic) or token (bearer), Fernet ciphertext; never rendered back.
    secret_encrypted = models.TextField(blank=True, default="", editable=False)
    timeout_seconds = models.FloatField(
        _("timeout (seconds)"),
        default=5.0,
        validators=[MinValueValidator(0.1), MaxValueValidator(60.0)],
        help_text=_("How long each request may take before the read fails."),
    )
    step_seconds = models.FloatField(
        _("query step (seconds)"),
        default=15.0,
        validators=[MinValueValidator(1.0), MaxValueValidator(3600.0)],
        help_text=_("Not longer than the scrape interval, or samples are missed."),
    )
    enabled = models.BooleanField(_("enabled"), default=True)
    last_tested_at = models.DateTimeField(_("last tested"), null=True, blank=True, editable=False)
    last_test_ok = models.BooleanField(null=True, editable=False)
    last_test_message = models.CharField(max_length=500, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("metrics source")
        verbose_name_plural = _("metrics sources")

    def __str__(self) -> str:
        return f"{self.name} ({self.base_url})"

    def clean(self) -> None:
        if self.auth == MetricsAuth.BASIC and not self.username:
            raise ValidationError({"username": _("Basic auth needs a user name.")})

    def set_secret(self, value: str) -> None:
        self.secret_encrypted = crypto.encrypt(value) if value else ""

    def source(self) -> PrometheusSource:
        """What the adapter reads with; ValueError if the secret cannot be decrypted."""
        secret = crypto.decrypt(self.secret_encrypted) if self.secret_encrypted else ""
        return PrometheusSource(
            base_url=self.base_url,
            timeout=self.timeout_seconds,
            step=self.step_seconds,
            username=self.username if self.auth == MetricsAuth.BASIC else "",
            password=secret if self.auth == MetricsAuth.BASIC else "",
            bearer_token=secret if self.auth == MetricsAuth.BEARER else "",
        )


class SystemSources(models.Model):
    """The evidence sources an admin attaches to a system (issue 36 item 1): its metrics
    (a configured Prometheus), its code (an MCP git server over a local repository, each
    exchange within the server's own call timeout) and its logs (the incident bundle's,
    for now). A session started on the system's sources reads these instead of the
    bundle's metrics.csv and repo/, and records so in `diagnosis.requested`."""

    system = models.SlugField(
        _("system"), max_length=60, unique=True, help_text=_("The system's slug, e.g. shop.")
    )
    metrics = models.ForeignKey(
        MetricsSource,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        verbose_name=_("metrics source"),
        help_text=_("Empty: the bundle's metrics.csv."),
    )
    code_server = models.ForeignKey(
        "tools.McpServer",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        verbose_name=_("code: MCP git server"),
        help_text=_("Its {repo} argument is the repository below. Empty: the bundle's repo/."),
    )
    repo_path = models.CharField(
        _("code: local repository"),
        max_length=500,
        blank=True,
        help_text=_("An absolute path to a git repository on the workers' host."),
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["system"]
        verbose_name = _("system's sources")
        verbose_name_plural = _("systems' sources")

    def __str__(self) -> str:
        return self.system

    def clean(self) -> None:
        if self.system != demo_shop().slug:
            raise ValidationError(
                {"system": _("No system is named %(name)s.") % {"name": self.system}}
            )
        if bool(self.code_server_id) != bool(self.repo_path):
            raise ValidationError(
                {"repo_path": _("A code source needs both its git server and its repository.")}
            )
        if self.repo_path and not (Path(self.repo_path).is_absolute() and is_git(self.repo_path)):
            raise ValidationError(
                {"repo_path": _("Not an absolute path to a git repository on this host.")}
            )


def is_git(path: str) -> bool:
    return (Path(path) / ".git").exists() or (Path(path) / "HEAD").is_file()
