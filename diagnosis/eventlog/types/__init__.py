"""The core's event types, declared with the registry when the diagnosis app starts."""

from __future__ import annotations

from diagnosis.eventlog import registry
from diagnosis.eventlog.types import actions, agent, findings, runs, session


def declare() -> None:
    registry.register(*session.TYPES, *agent.TYPES, *runs.TYPES, *actions.TYPES, *findings.TYPES)
