from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models

from diagnosis.models import Session
from scenarios_admin.models import Scenario


class Decision(models.TextChoices):
    DROP = "drop", "Drop (discarded, counted)"
    SINK = "sink", "Sink (kept, no session)"
    DELIVER = "deliver", "Deliver (session)"
    REFUSE = "refuse", "Refuse (invalid, kept as sent)"


class Stage(models.TextChoices):
    VALIDATE = "validate", "Validate"
    LOOP = "loop", "Loop guard"
    MATCH = "match", "Match a scenario"
    SCORE = "score", "Score"
    DEDUP = "dedup", "Deduplicate"
    POLICY = "policy", "Policy"
    DELIVER = "deliver", "Deliver"


class GateSettings(models.Model):
    """The gate's thresholds (one row). Saving it, or any rule, reloads the gate."""

    deliver_threshold = models.PositiveSmallIntegerField(
        default=50, help_text="Score at or above which a matched alert opens/joins a session."
    )
    sink_threshold = models.PositiveSmallIntegerField(
        default=20, help_text="Score at or above which an alert is kept without a session."
    )
    dedup_window_seconds = models.PositiveIntegerField(
        default=300,
        help_text="A repeat of the same alert (fingerprint, group, status) inside this "
        "window is dropped while its episode is open (not resolved, same start, its "
        "session not ended).",
    )
    severity_scores = models.JSONField(
        default=dict,
        blank=True,
        help_text='Points by the alert\'s "severity" label, e.g. {"critical": 60, "warning": 30}.',
    )
    unmatched = models.CharField(
        max_length=8,
        choices=[(Decision.SINK, "Sink"), (Decision.DROP, "Drop")],
        default=Decision.SINK,
        help_text="What happens to an alert no rule matches.",
    )
    revision = models.PositiveIntegerField(default=0, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "gate settings"
        verbose_name_plural = "gate settings"

    def __str__(self) -> str:
        return f"Gate settings (revision {self.revision})"

    @classmethod
    def load(cls) -> GateSettings:
        row, _ = cls.objects.get_or_create(
            pk=1, defaults={"severity_scores": {"critical": 60, "warning": 30, "info": 0}}
        )
        return row


class GateRule(models.Model):
    """Routes matching alerts to a scenario, with a score and an optional fixed action."""

    class Action(models.TextChoices):
        AUTO = "auto", "By score (thresholds)"
        DELIVER = "deliver", "Always deliver"
        SINK = "sink", "Always sink"
        DROP = "drop", "Always drop"

    name = models.CharField(max_length=80, unique=True)
    position = models.PositiveSmallIntegerField(default=100, help_text="Lower runs first.")
    enabled = models.BooleanField(default=True)
    matchers = models.JSONField(
        default=dict,
        help_text='Label -> regular expression (full match), e.g. {"alertname": "FuelLeak.*"}. '
        "All must match; an empty object matches every alert.",
    )
    scenario = models.ForeignKey(
        Scenario,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="The scenario a delivered alert opens a session in.",
    )
    base_score = models.PositiveSmallIntegerField(default=0)
    action = models.CharField(max_length=8, choices=Action.choices, default=Action.AUTO)
    group_by = models.JSONField(
        default=list,
        blank=True,
        help_text='Labels forming the group key of generic alerts, e.g. ["alertname", "instance"] '
        "(Alertmanager sends its own groupKey).",
    )

    class Meta:
        ordering = ["position", "id"]

    def __str__(self) -> str:
        return self.name


class AlertGroup(models.Model):
    """One alert group (Alertmanager's groupKey, or the rule's group labels) and the
    session it delivered into. Locked while delivering, so a repeat never opens a second
    session."""

    group_key = models.CharField(max_length=255, unique=True)
    session = models.ForeignKey(
        Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return self.group_key


class Observation(models.Model):
    """Every alert that came in and what the gate decided, with the stage that decided.
    Dropped alerts keep only their identity (counted); sunk and delivered ones keep
    their labels and annotations."""

    received_at = models.DateTimeField(auto_now_add=True)
    source = models.CharField(max_length=64, help_text="alertmanager, generic, agent:…")
    actor = models.CharField(max_length=150, blank=True)
    name = models.CharField(max_length=200, blank=True, help_text="The alertname label.")
    status = models.CharField(max_length=8, default="firing")
    fingerprint = models.CharField(max_length=64)
    group_key = models.CharField(max_length=255, blank=True)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict)
    starts_at = models.DateTimeField(null=True, blank=True)
    decision = models.CharField(max_length=8, choices=Decision.choices)
    stage = models.CharField(max_length=8, choices=Stage.choices)
    reason = models.CharField(max_length=300)
    score = models.SmallIntegerField(default=0)
    rule = models.ForeignKey(
        GateRule, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    session = models.ForeignKey(
        Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    config_revision = models.CharField(max_length=80, blank=True)
    received_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-received_at", "-id"]
        indexes = [
            # the dedup stage: "this alert's latest observation in this group"
            models.Index(
                fields=["fingerprint", "group_key", "-received_at"],
                name="observation_episode_idx",
            ),
            # pruning by age
            models.Index(fields=["received_at"], name="observation_received_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name or self.fingerprint} {self.status}: {self.decision} at {self.stage}"

    def as_record(self) -> dict[str, Any]:
        return {
            "observation": self.pk,
            "name": self.name,
            "status": self.status,
            "decision": self.decision,
            "stage": self.stage,
            "reason": self.reason,
        }
