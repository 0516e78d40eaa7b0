from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from scenarios_admin.models import Scenario, ScenarioVersion


class SessionStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    WAITING_USER = "waiting_user", _("Waiting for people")
    RETRYING = "retrying", _("Retrying")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELED = "canceled", _("Canceled")


ENDED_STATUSES = frozenset({SessionStatus.COMPLETED, SessionStatus.FAILED, SessionStatus.CANCELED})

# The session state machine (diagnosis tech plan §5.3). A decision or an answer puts a
# waiting session back in the queue; a failed session may be retried by hand.
SESSION_TRANSITIONS: dict[str, frozenset[str]] = {
    # A resumed job may find the session still waiting (nothing new to resume with).
    # An operator may close a session with a summary (completed) whenever it may be canceled.
    SessionStatus.QUEUED: frozenset({"running", "waiting_user", "canceled", "failed", "completed"}),
    SessionStatus.RUNNING: frozenset(
        {"waiting_user", "retrying", "completed", "failed", "canceled", "queued"}
    ),
    SessionStatus.WAITING_USER: frozenset({"queued", "running", "canceled", "failed", "completed"}),
    SessionStatus.RETRYING: frozenset({"running", "failed", "canceled", "queued", "completed"}),
    SessionStatus.FAILED: frozenset({"queued"}),
    SessionStatus.COMPLETED: frozenset(),
    SessionStatus.CANCELED: frozenset(),
}


class SessionQuerySet(models.QuerySet["Session"]):
    def visible(self) -> SessionQuerySet:
        return self.filter(deleted_at__isnull=True)


class Session(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    scenario = models.ForeignKey(Scenario, on_delete=models.PROTECT, related_name="sessions")
    scenario_version = models.ForeignKey(
        ScenarioVersion, on_delete=models.PROTECT, related_name="sessions"
    )
    title = models.CharField(max_length=200)
    language = models.CharField(max_length=2, default="en")
    status = models.CharField(
        max_length=16, choices=SessionStatus.choices, default=SessionStatus.QUEUED
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="incident_sessions"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0))
    # Soft delete (admins): out of every list, its events and audit entries kept; replay
    # still shows it, marked deleted. A `session.deleted` event records it.
    deleted_at = models.DateTimeField(null=True, blank=True)
    deleted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    # Event sequence allocation: the last seq handed out (locked row, no gaps).
    last_seq = models.PositiveBigIntegerField(default=0)
    # The hash of the last event (diagnosis.chain); 64 zeros before the first.
    chain_head = models.CharField(max_length=64, default="0" * 64)
    # What the agent currently knows (fields, risk, impact, enrichment, fsm, question):
    # a materialised view of the event log for pages and the CLI.
    snapshot = models.JSONField(default=dict)
    # One job at a time per session: a lease in the database, not Redis.
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Who holds it, "host:pid", written by the UPDATE that takes the lease: a holder
    # killed before it wrote anything else is still seen to be gone.
    lease_holder = models.CharField(max_length=300, blank=True, default="")
    job_attempts = models.PositiveSmallIntegerField(default=0)
    failure = models.TextField(blank=True)

    objects = SessionQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # the session list, newest first, keyset-paginated on (created_at, id)
            models.Index(fields=["-created_at", "-id"], name="session_created_id_idx"),
            # session list filtered by status, newest first
            models.Index(fields=["status", "-created_at"], name="session_status_created_idx"),
            # history by scenario (problem type), newest first
            models.Index(fields=["scenario", "-created_at"], name="session_scenario_created_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=[s.value for s in SessionStatus]),
                name="session_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.title

    @property
    def is_deleted(self) -> bool:
        return self.deleted_at is not None

    @property
    def is_ended(self) -> bool:
        return self.status in ENDED_STATUSES

    @property
    def group_name(self) -> str:
        return f"session-{self.pk.hex}"

    def can_transition(self, to: str) -> bool:
        return to == self.status or to in SESSION_TRANSITIONS[self.status]


class AgentRun(models.Model):
    """One job's run of the agent (root) and each node execution under it (children)."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runs")
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="children"
    )
    agent_name = models.CharField(max_length=64)
    mode = models.CharField(max_length=16, default="react")
    status = models.CharField(max_length=16, default="running")
    # Not auto_now_add: a node run is written with its group's commit, after it ran, with
    # the time it started.
    started_at = models.DateTimeField(default=timezone.now, editable=False)
    ended_at = models.DateTimeField(null=True, blank=True)
    input_snapshot = models.JSONField(default=dict)
    output_summary = models.JSONField(default=dict)

    class Meta:
        ordering = ["started_at", "id"]
        indexes = [
            # agent tree of a session
            models.Index(fields=["session", "parent", "status"], name="run_session_parent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.agent_name} ({self.status})"


class ToolCallStatus(models.TextChoices):
    PROPOSED = "proposed", _("Proposed")
    AWAITING_APPROVAL = "awaiting_approval", _("Awaiting approval")
    APPROVED = "approved", _("Approved")
    # Handed to the outbox: the effect may have reached the external system, its result
    # is not recorded yet (diagnosis/outbox.py).
    EXECUTING = "executing", _("Executing")
    REJECTED = "rejected", _("Rejected")
    TIMEOUT = "timeout", _("Timed out")
    RUNNING = "running", _("Running")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    REFUSED = "refused", _("Refused by compliance")
    CANCELED = "canceled", _("Canceled with the session")


# The decision_reason of a call withdrawn after a correction: its status is
# CANCELED too, and the pages say "withdrawn" for these, not "canceled with the session".
WITHDRAWN_ASKED_AGAIN = "requested under the earlier facts; asked again for the corrected ones"
WITHDRAWN_NOT_CALLED_FOR = "no longer called for by the corrected facts"
# After an optional question's answer re-assessed the risk (it was asked alongside).
WITHDRAWN_SUPERSEDED = "superseded: an answer re-assessed the risk; asked again for the new facts"
WITHDRAWN_NOT_CALLED_FOR_ANSWER = "no longer called for after an answer re-assessed the risk"


class ToolCall(models.Model):
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="tool_calls")
    agent_run = models.ForeignKey(
        AgentRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="tool_calls"
    )
    call_id = models.CharField(max_length=120, help_text="Stable id within the session.")
    tool_name = models.CharField(max_length=64)
    risk_class = models.CharField(max_length=2, default="R0")
    is_action = models.BooleanField(default=False)
    idempotency_key = models.CharField(max_length=200, unique=True)
    request_payload = models.JSONField(default=dict)
    response_payload = models.JSONField(default=dict)
    status = models.CharField(max_length=20, choices=ToolCallStatus.choices)
    decision_reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    position = models.PositiveSmallIntegerField(default=0, help_text="Order among actions.")
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            # session page: a session's tool calls, newest first
            models.Index(fields=["session", "-created_at"], name="toolcall_session_created_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "call_id"], name="toolcall_session_call_unique"
            ),
            models.CheckConstraint(
                condition=Q(risk_class__in=["R0", "R1", "R2", "R3"]),
                name="toolcall_risk_class_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool_name}({self.request_payload})"

    @property
    def is_decided(self) -> bool:
        return self.status not in (ToolCallStatus.PROPOSED, ToolCallStatus.AWAITING_APPROVAL)


class OutboxStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    REFUSED = "refused", "Refused by the policy"


class Outbox(models.Model):
    """One external effect to perform (diagnosis/outbox.py): written in the transaction
    that decided it, executed after that commit with the call's idempotency key, its
    result recorded once. A projection of the `tool.call_queued` ... `tool.call_completed`
    events, like the ToolCall row."""

    tool_call = models.OneToOneField(ToolCall, on_delete=models.CASCADE, related_name="outbox")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="outbox")
    idempotency_key = models.CharField(max_length=200, unique=True)
    status = models.CharField(
        max_length=10, choices=OutboxStatus.choices, default=OutboxStatus.PENDING
    )
    # Attempts are the call's (ToolCall.attempts, one `tool.call_started` each).
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"outbox {self.idempotency_key} ({self.status})"


class ExternalEffect(models.Model):
    """The simulated external systems' own record (ATC, the airport operations database,
    dispatch), as a real API with idempotency keys keeps one: one row per key, the effect
    done once, every request with that key counted. Not our state: nothing folds it."""

    system = models.CharField(max_length=32)
    operation = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=200, unique=True)
    request = models.JSONField(default=dict)
    response = models.JSONField(default=dict)
    requests = models.PositiveIntegerField(default=1, help_text="Calls seen with this key.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.system}.{self.operation} {self.idempotency_key}"


class LLMCall(models.Model):
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="llm_calls")
    agent_run = models.ForeignKey(
        AgentRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="llm_calls"
    )
    provider = models.CharField(max_length=80)
    model = models.CharField(max_length=120)
    purpose = models.CharField(max_length=32)
    status = models.CharField(max_length=16, default="ok")
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal(0))
    # The provider reported no usage: the tokens (and so the cost) are AERO's estimate.
    tokens_estimated = models.BooleanField(default=False)
    latency_ms = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    # Why the attempt failed (diagnosis.agent.usage.ErrorClass), empty when it did not.
    error_class = models.CharField(max_length=16, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.provider}/{self.model} {self.purpose}"


class Event(models.Model):
    """The spine: every state change of a session, with a per-session gap-free seq."""

    id = models.BigAutoField(primary_key=True)
    event_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=48)
    # Set before the insert (not auto_now_add): the hash covers it.
    ts = models.DateTimeField(default=timezone.now)
    payload = models.JSONField(default=dict)
    trace_id = models.CharField(max_length=32, blank=True)
    producer = models.CharField(max_length=64)
    run = models.ForeignKey(
        AgentRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    # Set on events a re-run may try to write again (diagnosis.events.append_keyed): the
    # database refuses a second one.
    key = models.CharField(max_length=200, blank=True, default="")
    # sha256(previous event's hash || canonical(this event)): see diagnosis.chain.
    hash = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering = ["session", "seq"]
        constraints = [
            # timeline pages and catch-up read "events of a session after seq N"
            models.UniqueConstraint(fields=["session", "seq"], name="event_session_seq_unique"),
            models.UniqueConstraint(
                fields=["session", "key"], condition=~Q(key=""), name="event_session_key_unique"
            ),
        ]
        indexes = [models.Index(fields=["ts"], name="event_ts_idx")]

    def __str__(self) -> str:
        return f"#{self.seq} {self.type}"

    def as_envelope(self) -> dict[str, Any]:
        return {
            "event_id": str(self.event_id),
            "session_id": str(self.session_id),
            "type": self.type,
            "ts": self.ts.isoformat(),
            "seq": self.seq,
            "payload": self.payload,
        }


class Report(models.Model):
    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="report")
    language = models.CharField(max_length=2)
    markdown = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Report for {self.session_id}"


class WorkerBeat(models.Model):
    """A background worker's own heartbeat, in the database: /healthz reads it
    whether or not Redis answers. One row per running worker process, written every
    AERO_HEARTBEAT_SECONDS by a thread of its own, deleted when the worker exits."""

    name = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(db_index=True)
    # The session whose job the worker runs now, if any (for operators reading /healthz).
    session_id = models.UUIDField(null=True, blank=True)
    stopping = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.name} ({self.host}:{self.pid})"


class LLMRequestStatus(models.TextChoices):
    PENDING = "pending", _("Waiting for the model")
    DONE = "done", _("Answered")
    FAILED = "failed", _("Every model provider failed")


class LLMRequest(models.Model):
    """A model call as a wait: a graph node records what it would send, keyed by
    its LangGraph task and the call's place in the node, and interrupts; the LLM runner
    claims the row with a lease (like a job's), makes the call with retries and fallback,
    streams its text into the log, records the attempts (`LLMCall`) once, stores the reply
    here and enqueues the session; the re-run node reads the reply instead of calling."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="llm_requests")
    key = models.CharField(max_length=200, unique=True)
    purpose = models.CharField(max_length=32)
    # The chat request: serialized messages and the call's options (tools, response format).
    request = models.JSONField(default=dict)
    # The real providers to try, by ProviderConfig id, in order (the offline provider,
    # last in every chain, is the node's own business: it needs no wait).
    providers = models.JSONField(default=list)
    status = models.CharField(
        max_length=16, choices=LLMRequestStatus.choices, default=LLMRequestStatus.PENDING
    )
    reply = models.JSONField(null=True, blank=True)
    # Which provider answered (its name), for the node's bookkeeping.
    answered_by = models.CharField(max_length=80, blank=True)
    error = models.TextField(blank=True)
    # The text streamed so far (the live panel and a reload without JavaScript read it).
    text = models.TextField(blank=True)
    # The agent run that asked (a specialist's, a job's): its streamed text, its calls
    # and their tokens belong to that run's node of the agent tree.
    agent_run = models.ForeignKey(
        AgentRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    claim_token = models.UUIDField(null=True, blank=True)
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    claims = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["created_at"],
                name="llmrequest_pending_idx",
                condition=models.Q(status="pending"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"
