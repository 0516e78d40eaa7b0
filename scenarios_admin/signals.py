"""Hooks for the apps to the left of scenarios_admin (which it must not import).

`publish_check` is sent before a scenario version is published, with the definition about
to be frozen. Each receiver returns a list of failures (empty: fine). The diagnosis app,
which owns the agent runtime, connects the scenario self-check here: publishing runs the
scenario's example cases through the real extraction and policy code.
"""

from __future__ import annotations

from django.dispatch import Signal

publish_check = Signal()  # sender=Scenario, definition=dict -> list[str] of failures
