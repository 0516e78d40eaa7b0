"""What read-only viewers (auditors) may not see in replays and exports.

The policy is a setting (`AERO_REPLAY_MASK`, JSON in the environment): a list of rules,
each naming event types (shell patterns), payload keys and, optionally, the risk classes
it applies to (the event's `risk_level`). A masked value is replaced by the word
"masked" — never dropped — so the reader sees that something was there.
"""

from __future__ import annotations

import fnmatch
from functools import cache
from typing import Any

from django.conf import settings
from pydantic import BaseModel, Field, TypeAdapter

from aero.roles import ADMIN, APPROVER, OPERATOR, user_roles
from diagnosis.eventlog import registry

MASKED = "masked"
_EMPTY: tuple[Any, ...] = (None, "", {}, [])
# Roles that see these payloads on the live pages anyway; masking them here hides nothing.
UNMASKED_ROLES = frozenset({ADMIN, OPERATOR, APPROVER})


class MaskRule(BaseModel):
    types: list[str] = Field(min_length=1)
    fields: list[str] = Field(min_length=1)
    risk_classes: list[str] = Field(default_factory=list)  # empty: every event of the types


@cache
def _rules(policy_key: str) -> tuple[MaskRule, ...]:
    raw = getattr(settings, "AERO_REPLAY_MASK", None)
    # Without the setting: what each event type declares (diagnosis.eventlog.registry).
    policy = raw if raw is not None else registry.mask_rules()
    return tuple(TypeAdapter(list[MaskRule]).validate_python(policy))


def rules() -> tuple[MaskRule, ...]:
    # Keyed by the setting's repr so tests that override it get their own rules.
    return _rules(repr(getattr(settings, "AERO_REPLAY_MASK", None)))


def masks_for(user: Any) -> bool:
    """Auditors (and any viewer without an operating role) see the masked view."""
    return not (user_roles(user) & UNMASKED_ROLES)


def masked_keys(event_type: str, payload: dict[str, Any]) -> list[str]:
    risk = str(payload.get("risk_level", ""))
    keys: list[str] = []
    for rule in rules():
        if not any(fnmatch.fnmatchcase(event_type, pattern) for pattern in rule.types):
            continue
        if rule.risk_classes and risk not in rule.risk_classes:
            continue
        # An empty value hides nothing: it stays as it is.
        keys.extend(k for k in rule.fields if payload.get(k) not in _EMPTY and k not in keys)
    return keys


def mask_payload(event_type: str, payload: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    keys = masked_keys(event_type, payload)
    if not keys:
        return payload, []
    return {k: (MASKED if k in keys else v) for k, v in payload.items()}, keys


def mask_call(call: dict[str, Any], event_type: str) -> dict[str, Any]:
    """A tool call or approval of the folded state, masked like its events would be."""
    probe = {"risk_level": call.get("risk_class", ""), "args": 1, "response": 1, "error": 1}
    keys = masked_keys(event_type, probe)
    if not keys:
        return call
    masked = dict(call)
    if "args" in keys:
        masked["args"] = MASKED
    if "response" in keys and masked.get("result"):
        masked["result"] = MASKED
    if "error" in keys and masked.get("error"):
        masked["error"] = MASKED
    masked["masked"] = True
    return masked
