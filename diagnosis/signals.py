"""Hooks for the apps to the left of diagnosis (which it must not import).

`approval_required` is sent inside the transaction that marks a tool call as awaiting
approval; the approvals app creates its Approval row in that same transaction.

`session_closing` is sent inside the transaction that cancels or deletes a session, with
the session row locked: the approvals app closes the session's open approvals there
(each with its event), so none is left in the queue to time out later.
"""

from __future__ import annotations

from django.dispatch import Signal

approval_required = Signal()  # sender=ToolCall, tool_call=ToolCall
# The same for calls the agent inserted together in its step (one INSERT for their
# approvals); `session` is what their state digest is taken from. Receivers return
# {tool_call pk: what its approval was opened with}.
# sender=ToolCall, tool_calls=list[ToolCall], session=Session
approvals_required = Signal()

# Sent (inside the executing transaction, the call row locked) before an approved call
# runs; receivers return a list of reasons it must not run. No receiver: nothing runs.
execution_check = Signal()  # sender=ToolCall, tool_call=ToolCall
# sender=Session, session=Session, user=User, reason=str
session_closing = Signal()
# Sent inside the agent step that withdraws an action a corrected fact no longer calls
# for (the call row is being closed); the approvals app closes its open Approval.
# sender=ToolCall, tool_call=ToolCall, reason=str, at=datetime
approval_withdrawn = Signal()
