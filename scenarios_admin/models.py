from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from aero import crypto


class ScenarioKind(models.TextChoices):
    APRON = "apron", "Apron emergency"
    DIAGNOSIS = "diagnosis", "IT problem diagnosis"


class Scenario(models.Model):
    """A scenario and its draft: the fields below and the draft rows (ScenarioField and
    FieldValue here, the rest its pack's row editor's: aero.packs DomainPack.draft_rows)
    are what admins edit. Sessions never read the draft: they run a published
    ScenarioVersion."""

    slug = models.SlugField(max_length=64, unique=True)
    name_zh = models.CharField("name (zh)", max_length=120)
    name_en = models.CharField("name (en)", max_length=120)
    kind = models.CharField(max_length=16, choices=ScenarioKind.choices)
    is_active = models.BooleanField(default=True, help_text=_("Offered for new sessions."))
    system_prompt = models.TextField(
        blank=True, help_text=_("Instructions for LLM providers (the offline provider ignores it).")
    )
    report_template_zh = models.TextField("report template (zh)", blank=True)
    report_template_en = models.TextField("report template (en)", blank=True)
    # The model budget of a session; empty: the provider's, else unlimited.
    budget_steps = models.PositiveIntegerField(
        "step budget", null=True, blank=True, help_text=_("Reasoning steps that ask the model.")
    )
    budget_tokens = models.PositiveIntegerField(
        "token budget", null=True, blank=True, help_text=_("Model tokens in + out.")
    )
    budget_cost = models.DecimalField(
        "cost budget (¥)", max_digits=10, decimal_places=4, null=True, blank=True
    )
    # The draft of a kind whose pack edits it as one YAML document (aero.packs
    # edited_as_yaml), as the definition it describes; empty: the newest version's.
    definition_draft = models.JSONField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return f"{self.name_en} / {self.name_zh}"

    def latest_version(self) -> ScenarioVersion | None:
        return self.versions.order_by("-number").first()

    def has_draft(self) -> bool:
        return self.draft_fields.exists()


class Priority(models.TextChoices):
    P1 = "P1", "P1 (required before risk assessment)"
    P2 = "P2", "P2 (optional)"


class Level(models.TextChoices):
    HIGH = "HIGH", "HIGH"
    MEDIUM = "MEDIUM", "MEDIUM"
    LOW = "LOW", "LOW"


class RiskClass(models.TextChoices):
    R0 = "R0", "R0 (automatic, recorded)"
    R1 = "R1", "R1 (one confirmation)"
    R2 = "R2", "R2 (confirmed twice)"
    R3 = "R3", "R3 (forced confirmation with a reason)"


POSITION_HELP = _("Order; lower first. Leave empty to add at the end.")
LIST_HELP = _("Separated by commas or one per line.")


class DraftRow(models.Model):
    """A row of a scenario's draft. Rows are ordered by position (then id)."""

    position = models.PositiveIntegerField(null=True, blank=True, help_text=POSITION_HELP)

    class Meta:
        abstract = True


class ScenarioField(DraftRow):
    scenario = models.ForeignKey(Scenario, on_delete=models.CASCADE, related_name="draft_fields")
    name = models.CharField(max_length=64, help_text=_("e.g. fluid_type (lower case, _)."))
    label_zh = models.CharField("label (zh)", max_length=120)
    label_en = models.CharField("label (en)", max_length=120)
    # One of the installed packs' field types (scenarios_admin.schema.field_type_labels):
    # the row editor offers them, the definition's model checks them.
    type = models.CharField(max_length=16)
    priority = models.CharField(max_length=2, choices=Priority.choices)
    ask_zh = models.TextField("ask prompt (zh)", blank=True)
    ask_en = models.TextField("ask prompt (en)", blank=True)
    kinds = models.CharField(
        max_length=64, blank=True, help_text=_("Position fields: node kinds accepted (empty: all).")
    )
    default = models.CharField(
        max_length=64, blank=True, help_text=_("Enum fields: value if absent.")
    )
    measure_units = models.CharField(
        max_length=300, blank=True, help_text=_("Enum fields read from a quantity: its units.")
    )
    measure_bands = models.CharField(
        max_length=300, blank=True, help_text=_("e.g. LARGE>5, MEDIUM>=1, SMALL (first match).")
    )

    class Meta:
        ordering = ["scenario", "position", "id"]
        verbose_name = "field"
        constraints = [
            models.UniqueConstraint(fields=["scenario", "name"], name="scenario_field_name_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class FieldValue(DraftRow):
    scenario = models.ForeignKey(Scenario, on_delete=models.CASCADE, related_name="draft_values")
    field = models.CharField(max_length=64, help_text=_("The enum or bool field (its name)."))
    value = models.CharField(max_length=64, help_text=_("e.g. FUEL; bool fields: true and false."))
    label_zh = models.CharField("label (zh)", max_length=120, blank=True)
    label_en = models.CharField("label (en)", max_length=120, blank=True)
    synonyms = models.TextField(
        blank=True,
        help_text=format_lazy("{} {}", _("Words the offline extractor recognises."), LIST_HELP),
    )
    fallback = models.TextField(
        blank=True,
        help_text=format_lazy(
            "{} {}", _("Used only when no other value of the field is named."), LIST_HELP
        ),
    )

    class Meta:
        ordering = ["scenario", "field", "position", "id"]
        verbose_name = "field value"
        constraints = [
            models.UniqueConstraint(
                fields=["scenario", "field", "value"], name="scenario_field_value_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.field}={self.value}"


class ScenarioVersion(models.Model):
    """An immutable published definition. Sessions pin one; edits publish a new one."""

    scenario = models.ForeignKey(Scenario, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    definition = models.JSONField()
    checksum = models.CharField(max_length=64, editable=False)
    published_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    published_at = models.DateTimeField(auto_now_add=True)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["scenario", "-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["scenario", "number"], name="scenario_version_number_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.scenario.slug} v{self.number}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise PermissionError("a published scenario version is immutable")
        self.checksum = self.checksum_of(self.definition)
        super().save(*args, **kwargs)

    @staticmethod
    def checksum_of(definition: dict[str, Any]) -> str:
        canonical = json.dumps(definition, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()


class ProviderKind(models.TextChoices):
    OFFLINE = "offline", "Offline (deterministic)"
    OPENAI = "openai", "OpenAI-compatible"


class ProviderConfig(models.Model):
    """An LLM provider. Enabled providers are tried by priority; offline is the last resort."""

    name = models.CharField(max_length=80, unique=True)
    kind = models.CharField(max_length=16, choices=ProviderKind.choices)
    base_url = models.URLField(blank=True)
    model = models.CharField(max_length=120, blank=True)
    api_key_encrypted = models.TextField(blank=True, editable=False)
    price_input_per_1k = models.DecimalField(max_digits=10, decimal_places=6, default=Decimal(0))
    price_output_per_1k = models.DecimalField(max_digits=10, decimal_places=6, default=Decimal(0))
    timeout_seconds = models.FloatField(default=30.0)
    retries = models.PositiveSmallIntegerField(default=3)
    priority = models.PositiveSmallIntegerField(default=100, help_text=_("Lower is tried first."))
    enabled = models.BooleanField(default=True)
    # A session's model budget when its scenario sets none (empty: unlimited). When it
    # runs out the session asks an approver to continue.
    max_steps = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Reasoning steps per session (empty: unlimited).")
    )
    max_tokens = models.PositiveIntegerField(
        null=True, blank=True, help_text=_("Tokens in + out per session (empty: unlimited).")
    )
    max_cost = models.DecimalField(
        max_digits=10,
        decimal_places=4,
        null=True,
        blank=True,
        help_text=_("Model cost per session, in yuan (empty: unlimited)."),
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["priority", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind="offline") | (Q(base_url__gt="") & Q(model__gt="")),
                name="provider_openai_needs_url_and_model",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def set_api_key(self, plaintext: str) -> None:
        self.api_key_encrypted = crypto.encrypt(plaintext) if plaintext else ""

    def api_key(self) -> str:
        return crypto.decrypt(self.api_key_encrypted) if self.api_key_encrypted else ""


class ProviderHealth(models.Model):
    """A provider's circuit breaker, in PostgreSQL so that every process (web, workers,
    LLM runners) routes by the same state (scenarios_admin.breaker has the rules). No row:
    closed, no failure counted yet."""

    provider = models.OneToOneField(
        ProviderConfig, on_delete=models.CASCADE, primary_key=True, related_name="health"
    )
    # Failed attempts in a row (the ones the breaker counts); a success resets it.
    failures = models.PositiveIntegerField(default=0)
    # Open until then (no call goes to the provider); past it, one probe call may go.
    open_until = models.DateTimeField(null=True, blank=True)
    opened_at = models.DateTimeField(null=True, blank=True)
    # A probe call is under way until then (one at a time; a prober that died frees it).
    probe_until = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    last_error_class = models.CharField(max_length=16, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.provider_id}: {self.failures} failures"
