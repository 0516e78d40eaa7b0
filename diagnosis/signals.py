"""Hooks for the apps to the left of diagnosis (which it must not import).

`approval_required` is sent inside the transaction that marks a tool call as awaiting
approval; the approvals app creates its Approval row in that same transaction.
"""

from __future__ import annotations

from django.dispatch import Signal

approval_required = Signal()  # sender=ToolCall, tool_call=ToolCall
