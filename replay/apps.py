from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class ReplayConfig(AppConfig):
    name = "replay"
    verbose_name = "Replay and export"

    def ready(self) -> None:
        checks.register(check_mask_policy)


def check_mask_policy(**kwargs: Any) -> list[checks.CheckMessage]:
    """A bad AERO_REPLAY_MASK fails at start-up, not on an auditor's first replay."""
    from pydantic import ValidationError

    from diagnosis.eventlog import masking

    try:
        masking.rules()
    except ValidationError as exc:
        return [checks.Error(f"AERO_REPLAY_MASK is not a list of rules: {exc}", id="replay.E001")]
    return []
