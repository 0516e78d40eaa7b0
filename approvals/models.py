from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from aero.packs import action_tool
from diagnosis import restrictions
from diagnosis.models import Session, ToolCall
from scenarios_admin.definition import BUDGET_TOOL, LIFT_TOOL


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    CONFIRMING = "confirming", _("Approved once, awaiting confirmation")
    APPROVED = "approved", _("Approved")
    REJECTED = "rejected", _("Rejected")
    TIMEOUT = "timeout", _("Timed out")
    # Closed without a decision: its session was canceled or closed, or a correction
    # withdrew it (the event says which).
    CANCELED = "canceled", _("Closed without a decision")


OPEN_STATUSES = (ApprovalStatus.PENDING, ApprovalStatus.CONFIRMING)
RISK_ORDER = {"R3": 3, "R2": 2, "R1": 1}


def _sha(body: Any) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def state_digest_of(session: Session) -> str:
    """What the session knew when the action was requested: a decision is only valid
    against that state."""
    snapshot = session.snapshot
    return _sha(
        {
            "status_ended": session.is_ended,
            "fields": snapshot.get("fields"),
            "risk": snapshot.get("risk"),
            "impact": snapshot.get("impact"),
        }
    )


def lift_state_digest(tool_call: ToolCall) -> str:
    """What a lift request is about: the restriction, in force. The session that put it
    in force may have ended long ago; its fields do not matter to the lift."""
    pk = tool_call.request_payload.get("restriction")
    model = restrictions.model()
    restriction = model.objects.filter(pk=pk).first()
    return _sha(
        {
            "restriction": restriction.pk if restriction else None,
            "kind": restriction.kind if restriction else None,
            "target": restriction.target if restriction else None,
            "in_force": restriction is not None and restriction.is_active,
        }
    )


def state_digest_for(tool_call: ToolCall, session: Session) -> str:
    if tool_call.tool_name == LIFT_TOOL:
        return lift_state_digest(tool_call)
    return state_digest_of(session)


def action_digest_of(tool_call: ToolCall) -> str:
    return _sha(
        {
            "session": str(tool_call.session_id),
            "tool_call": tool_call.pk,
            "tool": tool_call.tool_name,
            "args": tool_call.request_payload,
            "risk_class": tool_call.risk_class,
        }
    )


class ApprovalQuerySet(models.QuerySet["Approval"]):
    def open(self) -> ApprovalQuerySet:
        return self.filter(status__in=OPEN_STATUSES)

    def expired(self) -> ApprovalQuerySet:
        return self.open().filter(deadline__lte=timezone.now())


class Approval(models.Model):
    """A risky action (R1-R3) waiting for people. Bound to digests of the exact action and
    of the session state it was requested in."""

    tool_call = models.OneToOneField(ToolCall, on_delete=models.PROTECT, related_name="approval")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="approvals")
    risk_class = models.CharField(max_length=2)
    action_name = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    digest = models.CharField(max_length=64, help_text="Tool + arguments + session state.")
    action_digest = models.CharField(max_length=64, default="")
    state_digest = models.CharField(max_length=64, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    deadline = models.DateTimeField(null=True, blank=True)
    first_approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    first_approved_at = models.DateTimeField(null=True, blank=True)
    approver = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.TextField(blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    # The latest argument edit (approval.args_edited says it too): the card tells the next
    # approver that what they decide is not what the agent proposed, by whom and why.
    edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    edited_at = models.DateTimeField(null=True, blank=True)
    args_before_edit = models.JSONField(default=dict, blank=True)
    edit_reason = models.TextField(blank=True)

    objects = ApprovalQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # session page and queue: a session's approvals by status, newest first
            models.Index(
                fields=["session", "status", "-created_at"], name="approval_session_status_idx"
            ),
            # the queue page: open approvals grouped by incident, its nearest deadline
            # (and the risk filter) read from the index alone (approvals.presenters)
            models.Index(
                fields=["session", "deadline", "risk_class"],
                condition=Q(status__in=["pending", "confirming"]),
                name="approval_open_incident_idx",
            ),
            # the timeout sweeper: open approvals by deadline
            models.Index(
                fields=["deadline"],
                condition=Q(status__in=["pending", "confirming"]),
                name="approval_open_deadline_idx",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(risk_class__in=["R1", "R2", "R3"]),
                name="approval_risk_class_valid",
            ),
            models.CheckConstraint(
                condition=~Q(status="approved") | Q(approver__isnull=False),
                name="approval_approved_has_approver",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action_name} ({self.risk_class}, {self.status})"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES

    @staticmethod
    def digest_for(tool_call: ToolCall, state_digest: str) -> str:
        return _sha({"action": action_digest_of(tool_call), "state": state_digest})

    @property
    def is_lift(self) -> bool:
        return self.action_name == LIFT_TOOL

    @property
    def is_budget(self) -> bool:
        """The agent's request to continue past its model budget."""
        return self.action_name == BUDGET_TOOL

    @staticmethod
    def deadline_for(risk_class: str) -> Any:
        minutes = settings.AERO_APPROVAL_TIMEOUT_MINUTES[risk_class]
        return timezone.now() + timedelta(minutes=minutes)

    def needs_two_steps(self) -> bool:
        return self.risk_class == "R2" or (
            self.risk_class == "R3" and settings.AERO_TWO_PERSON_RULE
        )

    def is_past_deadline(self) -> bool:
        return self.deadline is not None and self.deadline <= timezone.now()

    def seconds_left(self) -> int | None:
        if self.deadline is None or not self.is_open:
            return None
        return max(0, int((self.deadline - timezone.now()).total_seconds()))

    @property
    def editable_args(self) -> list[str]:
        """The arguments an approver may correct before deciding (none for a lift; the
        agent's free-text ATC message is not one)."""
        if self.is_lift or self.is_budget:
            return []
        declared = action_tool(self.action_name)
        return list(declared.editable) if declared is not None else []

    def minutes_left(self) -> int | None:
        """Whole minutes, rounded up: "4 min" at 4:59 left would read as earlier than it is."""
        seconds = self.seconds_left()
        return None if seconds is None else -(-seconds // 60)


class ManualTodo(models.Model):
    """Work that people must do by hand because an approval timed out."""

    approval = models.OneToOneField(Approval, on_delete=models.PROTECT, related_name="todo")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="todos")
    title = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["resolved_at", "-created_at"]
        indexes = [
            # the to-do page: open items first
            models.Index(fields=["resolved_at", "-created_at"], name="todo_open_created_idx"),
        ]

    def __str__(self) -> str:
        return self.title

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None
