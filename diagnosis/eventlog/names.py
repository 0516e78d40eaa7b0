"""The core's event type names, for writers and readers to name them by (each is declared
with its payload, fold step and words in diagnosis.eventlog.types). A module of
constants only, so any module may import it without importing what the declarations do.
"""

from __future__ import annotations

# The session's life.
SESSION_CREATED = "session.created"
SESSION_STATUS_CHANGED = "session.status_changed"
SESSION_COMPLETED = "session.completed"
SESSION_CANCELED = "session.canceled"
SESSION_FAILED = "session.failed"
SESSION_DELETED = "session.deleted"
# What people and the agent said and recognised.
USER_MESSAGE = "user.message"
AGENT_QUESTION = "agent.question"
AGENT_QUESTION_CLOSED = "agent.question_closed"
AGENT_NOTE = "agent.note"
FIELDS_EXTRACTED = "fields.extracted"
TIMELINE_APPENDED = "timeline.appended"
REPORT_READY = "report.ready"
# A domain's findings (a kind: risk, impact, ...).
FINDING_RECORDED = "finding.recorded"
# The agent's steps, model calls and compliance.
AGENT_NODE_STARTED = "agent.node_started"
AGENT_NODE_COMPLETED = "agent.node_completed"
AGENT_NODE_FAILED = "agent.node_failed"
# A child agent run (a specialist) began or ended: its own status, times and tokens.
AGENT_RUN_STARTED = "agent.run_started"
AGENT_RUN_ENDED = "agent.run_ended"
LLM_CALL = "llm.call"
LLM_DELTA = "llm.delta"
LLM_FALLBACK = "llm.fallback"
LLM_SKIPPED = "llm.skipped"
FSM_TRANSITION = "fsm.transition"
FSM_VIOLATION = "fsm.violation"
BUDGET_EXHAUSTED = "budget.exhausted"
BUDGET_RAISED = "budget.raised"
BUDGET_STOPPED = "budget.stopped"
# Tool calls and their effects.
TOOL_CALL_QUEUED = "tool.call_queued"
TOOL_CALL_STARTED = "tool.call_started"
TOOL_CALL_RETRYING = "tool.call_retrying"
TOOL_CALL_COMPLETED = "tool.call_completed"
TOOL_CALL_FAILED = "tool.call_failed"
TOOL_CALL_REFUSED = "tool.call_refused"
# A slow tool's call made by the runner while the session waited (its outcome).
TOOL_SLOW_CALL = "tool.slow_call"
# Approvals of actions.
APPROVAL_REQUIRED = "approval.required"
APPROVAL_ARGS_EDITED = "approval.args_edited"
APPROVAL_FIRST_APPROVED = "approval.first_approved"
APPROVAL_APPROVED = "approval.approved"
APPROVAL_REJECTED = "approval.rejected"
APPROVAL_TIMEOUT = "approval.timeout"
APPROVAL_CANCELED = "approval.canceled"
# A session's end, by its status (set_status writes `session.<status>`).
ENDED_EVENT = {
    "completed": SESSION_COMPLETED,
    "canceled": SESSION_CANCELED,
    "failed": SESSION_FAILED,
}
# An approval's decision step, by its name (`approval.<step>`).
DECISION_EVENT = {
    "first_approved": APPROVAL_FIRST_APPROVED,
    "approved": APPROVAL_APPROVED,
    "rejected": APPROVAL_REJECTED,
    "timeout": APPROVAL_TIMEOUT,
    "canceled": APPROVAL_CANCELED,
}
