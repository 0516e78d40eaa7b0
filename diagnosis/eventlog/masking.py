"""What read-only viewers (auditors) may not see, on every surface they can reach.

The rule: each event type declares the payload keys it hides and for which risk classes
(diagnosis.eventlog.registry); a setting (`AERO_REPLAY_MASK`, JSON in the environment)
may replace it with its own list of rules, each naming event types (shell patterns),
payload keys and, optionally, the risk classes it applies to (the event's `risk_level`).
A masked value is replaced by the word "masked" (never dropped), so the reader sees
that something was there.

`session_mask(session, roles)` applies the rule for one viewer of one session: to its
events (pages, live fragments, the events list, replay, export, API, WebSocket), to its
tool calls, and to any text that may quote what the events hide (the report, the
export's embedded parts, search snippets, audit details): every value a masked payload
key holds there is replaced by the word.
"""

from __future__ import annotations

import copy
import fnmatch
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any

from django.conf import settings
from pydantic import BaseModel, Field, TypeAdapter

from aero.roles import ADMIN, APPROVER, OPERATOR, user_roles
from diagnosis.eventlog import names, registry
from diagnosis.models import Event, Session, ToolCall

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


def masks_roles(roles: Iterable[str]) -> bool:
    """Whether viewers with these roles get the masked view."""
    return not (frozenset(roles) & UNMASKED_ROLES)


def call_masked(risk_class: str) -> bool:
    """Whether the rule hides the arguments of a tool call of this risk class."""
    probe = {"risk_level": risk_class, "args": 1}
    return "args" in masked_keys(names.TOOL_CALL_COMPLETED, probe)


def _leaves(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, str | int | float) and not isinstance(value, bool):
        text = str(value).strip()
        if text and text != MASKED:
            yield text


@dataclass(frozen=True)
class SessionMask:
    """The rule applied for one read-only viewer of one session. `secrets`: the values
    its masked payload keys hold (an action's taxiway, stand, runway...), hidden in any
    text too. `pairs`: its masked calls' arguments as `key=value` (how report rows, call
    ids and outbox keys write them), hidden as `key=masked` even where the value is one
    the session states as a fact (the stand the operator reported)."""

    secrets: frozenset[str]
    pairs: frozenset[str] = frozenset()

    @cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        hidden = self.secrets | self.pairs
        if not hidden:
            return None
        # Longest first: "taxiway=A" before "A".
        alternatives = "|".join(re.escape(s) for s in sorted(hidden, key=len, reverse=True))
        # Whole values only: taxiway "A" is not the A of "AERO", of node "A1" or of
        # "B-6543"; letters of other scripts around a value do not join it ("滑行道A").
        return re.compile(rf"(?<![0-9A-Za-z_/-])(?:{alternatives})(?![0-9A-Za-z_/-])")

    def _hide(self, match: re.Match[str]) -> str:
        found = match.group()
        return f"{found.split('=', 1)[0]}={MASKED}" if found in self.pairs else MASKED

    def text(self, text: str) -> str:
        pattern = self._pattern
        return pattern.sub(self._hide, text) if pattern is not None and text else text

    def scrub(self, value: Any) -> Any:
        """`value` with every hidden value in its texts replaced (dicts and lists too)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.scrub(v) for v in value]
        return value

    def snapshot(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        """A session's snapshot as this viewer may see it: what its analyses found (the
        taxiways and runways an impact reaches, a lookup's result) names no hidden value."""
        return dict(self.scrub(snapshot))

    def shown(self, event_type: str, payload: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The payload as this viewer may see it and the keys the rule masked in it."""
        masked, keys = mask_payload(event_type, payload)
        return self.scrub(masked), keys

    def event(self, event: Event) -> Event:
        """A copy of `event` with its payload as this viewer may see it."""
        payload, _ = self.shown(event.type, event.payload)
        if payload == event.payload:
            return event
        shown = copy.copy(event)
        shown.payload = payload
        return shown

    def events(self, events: Iterable[Event]) -> list[Event]:
        return [self.event(e) for e in events]

    def call(self, call: ToolCall) -> bool:
        """Whether this call's arguments, result and consequences are hidden."""
        return call_masked(call.risk_class)

    def tool_call(self, call: ToolCall) -> ToolCall:
        """A copy of `call` to show: its arguments' names kept, their values, its result,
        error and call id masked; what people wrote about it with the values hidden."""
        shown = copy.copy(call)
        shown.decision_reason = self.text(call.decision_reason)
        if not self.call(call):
            # Its own values are shown; one a masked call hides is not, here either.
            shown.request_payload = self.scrub(call.request_payload)
            shown.response_payload = self.scrub(call.response_payload)
            shown.call_id = self.text(call.call_id)
            return shown
        shown.request_payload = {k: MASKED for k in call.request_payload}
        shown.response_payload = {}
        shown.error = MASKED if call.error else ""
        shown.call_id = MASKED
        return shown

    def approval(self, approval: Any) -> Any:
        """A copy of an Approval to show, masked as its call is."""
        shown = copy.copy(approval)
        shown.reason = self.text(approval.reason)
        shown.edit_reason = self.text(approval.edit_reason)
        if call_masked(approval.risk_class):
            shown.args_before_edit = {k: MASKED for k in approval.args_before_edit or {}}
        return shown


def secrets_of(session_id: Any) -> frozenset[str]:
    """The values the rule hides in this session (one query)."""
    return secrets_by_session([session_id]).get(str(session_id), frozenset())


def mask_of(session_id: Any) -> SessionMask:
    """The masking of one session for a read-only viewer: its hidden values and its
    masked calls' `key=value` pairs (one query)."""
    key = str(session_id)
    return hidden_by_session([key]).get(key, SessionMask(frozenset()))


def _scalars(args: Any) -> Iterator[tuple[str, str]]:
    if isinstance(args, dict):
        for name, value in args.items():
            scalar = isinstance(value, str | int | float) and not isinstance(value, bool)
            if scalar and str(value).strip() and str(value) != MASKED:
                yield str(name), str(value)


def secrets_by_session(session_ids: Iterable[Any]) -> dict[str, frozenset[str]]:
    """The values the rule hides in each of these sessions (see hidden_by_session)."""
    return {key: mask.secrets for key, mask in hidden_by_session(session_ids).items()}


def hidden_by_session(session_ids: Iterable[Any]) -> dict[str, SessionMask]:
    """Each session's masking for a read-only viewer, in one query: the values the rule
    hides (the arguments of its masked tool calls, the ones an approver's edit replaced,
    the parts of their call ids) and those arguments as `key=value`. Not a value a session
    states as one of its own facts (the position the operator reported is on the page
    whatever an action does with it); its `key=value` pair is hidden all the same."""
    found: dict[str, set[str]] = {}
    pairs: dict[str, set[str]] = {}
    facts: dict[str, set[str]] = {}
    rows = ToolCall.objects.filter(session_id__in=list(session_ids)).values_list(
        "session_id",
        "call_id",
        "risk_class",
        "request_payload",
        "approval__args_before_edit",
        "session__snapshot__fields",
    )
    for session_id, call_id, risk_class, args, before, fields in rows:
        key = str(session_id)
        facts.setdefault(key, set()).update(_leaves(fields))
        if not call_masked(risk_class):
            continue
        hidden = found.setdefault(key, set())
        hidden.update(_leaves(args))
        hidden.update(_leaves(before))
        # The call id repeats the arguments ("action:close_stand:stand=105").
        parts = [part for part in call_id.split(":") if "=" in part]
        hidden.update(part.split("=", 1)[1] for part in parts)
        written = pairs.setdefault(key, set())
        written.update(parts)
        written.update(f"{k}={v}" for k, v in [*_scalars(args), *_scalars(before)])
    return {
        key: SessionMask(frozenset(values - facts.get(key, set())), frozenset(pairs[key]))
        for key, values in found.items()
    }


def hiding(text: str, session_ids: Iterable[Any]) -> set[Any]:
    """The sessions among `session_ids` where `text` names a value the rule hides (or a
    part of one, three characters or more): a masked viewer's search must not find them
    by it. One query."""
    ids = list(session_ids)
    wanted = text.casefold()
    masks = hidden_by_session(ids)
    hidden = set()
    for session_id in ids:
        mask = masks.get(str(session_id), SessionMask(frozenset()))
        values = mask.secrets
        # A whole hidden value or `key=value` pair ("stand=105"), or a part of a value.
        named = mask.text(text) != text
        inside = len(wanted) >= 3 and any(wanted in value.casefold() for value in values)
        if named or inside:
            hidden.add(session_id)
    return hidden


def session_mask(session: Session | Any, roles: Iterable[str]) -> SessionMask | None:
    """The mask for viewers with `roles` of this session (an instance or its pk); None
    for viewers who see everything."""
    if not masks_roles(roles):
        return None
    return mask_of(getattr(session, "pk", session))


# Keys of an audit entry's detail that hold a call's arguments (before and after an edit).
AUDIT_ARGUMENTS = ("args", "before", "after")


class AuditMasks:
    """Audit entries' details as a read-only viewer may see them: the arguments of a
    masked call masked by key, every value its session hides masked in the rest. One
    mask per session, read when its first entry comes."""

    def __init__(self) -> None:
        self.masks: dict[str, SessionMask] = {}

    def detail(self, session_id: Any, detail: dict[str, Any]) -> dict[str, Any]:
        if not session_id or not isinstance(detail, dict):
            return detail
        key = str(session_id)
        if key not in self.masks:
            self.masks[key] = mask_of(session_id)
        shown = dict(detail)
        if call_masked(str(shown.get("risk_class", ""))):
            shown.update({k: MASKED for k in AUDIT_ARGUMENTS if shown.get(k) not in _EMPTY})
        return self.masks[key].scrub(shown)


def audit_mask_for(user: Any) -> Callable[[Any, dict[str, Any]], dict[str, Any]] | None:
    """The audit log's detail mask for this viewer (registered with aero.audit_views)."""
    return AuditMasks().detail if masks_roles(user_roles(user)) else None
