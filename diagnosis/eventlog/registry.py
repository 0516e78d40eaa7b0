"""Every event type, declared once: its payload model, its step of the fold, its summary
words, its timeline line and what read-only viewers may not see of it.

The fold (diagnosis.fold), the export (replay.export), the timeline (the `timeline`
template tags), the live page's panels and masking (diagnosis.eventlog.masking) read a type's
declaration here instead of each keeping its own `if type == ...` chain. The
declarations are made by the apps that own the types (diagnosis.eventlog.types, a
domain pack) when Django starts (AppConfig.ready), so this module imports none of them.

Appending checks the payload against its model and stores the payload as given (not the
model's dump): the hash chain hashes exactly what was written before, so old chains
still verify. A type no longer written (renamed) stays declared as `legacy`: old logs
still fold and render.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class Payload(BaseModel):
    """Base of every payload model: the fields a type's readers rely on are declared and
    checked; other keys are kept as written (a payload is a record, not a form)."""

    model_config = ConfigDict(extra="allow")


# The fold's step of a type: (diagnosis.eventlog.state.FoldState, the event) -> None. Typed
# loosely here: the state imports this module, not the other way round.
Reducer = Callable[[Any, Any], None]
SnapshotStep = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any] | None]
Summary = Callable[[dict[str, Any]], str]
ByPayload = Callable[[dict[str, Any]], Any]

# The timeline's lines: partials of this template unless a line names its own template.
EVENT_LINES_TEMPLATE = "diagnosis/_event_lines.html"


@dataclass(frozen=True)
class ByKey:
    """A timeline line chosen by one payload key: `names[value]`, else `any_value` when the
    key holds any other truthy value, else `default` (a line or another ByKey)."""

    key: str
    names: Mapping[Any, str] = field(default_factory=dict)
    any_value: str | None = None
    default: str | ByKey = "other"

    def __call__(self, payload: dict[str, Any]) -> str:
        value = payload.get(self.key)
        if value in self.names:
            return self.names[value]
        if value and self.any_value is not None:
            return self.any_value
        return self.default if isinstance(self.default, str) else self.default(payload)

    def lines(self) -> set[str]:
        default = {self.default} if isinstance(self.default, str) else self.default.lines()
        return {*self.names.values(), *([self.any_value] if self.any_value else []), *default}


@dataclass(frozen=True)
class EventType:
    name: str
    payload: type[BaseModel] = Payload
    # The fold's step: what the event changes in the folded session (in place).
    reduce: Reducer | None = None
    # The snapshot after the event, or None when it does not change it (never mutates).
    snapshot: SnapshotStep | None = None
    # One line of plain text for the export's chronology, in the reader's language.
    summary: Summary | None = None
    # The timeline partial: a name in EVENT_LINES_TEMPLATE ("template#name" for another
    # template), one chosen by a payload key, or (findings) by the finding's kind.
    line: str | ByKey | ByPayload = "other"
    # An agent internal (how the agent worked): folded under "details" on the page.
    internal: bool | ByPayload = False
    # Payload keys read-only viewers see as "masked", only when the event's risk_level is
    # one of `masked_at` (every event of the type when it is empty).
    masked: tuple[str, ...] = ()
    masked_at: tuple[str, ...] = ()
    # The live page's panels the event changes (the consumer re-renders only those).
    panels: frozenset[str] = field(default_factory=frozenset)
    # Read (fold, pages, export) but no longer written: appending one is refused.
    legacy: bool = False


class UnknownEventType(LookupError):
    pass


class InvalidPayload(ValueError):
    pass


_TYPES: dict[str, EventType] = {}
_FALLBACK = EventType(name="")


def register(*types: EventType) -> None:
    """Declare event types (from an AppConfig.ready()). A name declared twice is a bug,
    unless it is the same declaration again (ready() may run twice in tests)."""
    for event_type in types:
        held = _TYPES.get(event_type.name)
        if held is not None and held != event_type:
            raise RuntimeError(f"event type {event_type.name!r} is declared twice")
        _TYPES[event_type.name] = event_type


def registered() -> Mapping[str, EventType]:
    return _TYPES


def get(name: str) -> EventType:
    """The declaration of `name`; an unknown type (never written by this version) reads as
    a type with no fold step, no summary and the timeline's plain line."""
    return _TYPES.get(name, _FALLBACK)


def check_payload(name: str, payload: dict[str, Any]) -> None:
    """Refuse an event that is not declared, no longer written, or whose payload does not
    fit its model."""
    event_type = _TYPES.get(name)
    if event_type is None:
        raise UnknownEventType(f"event type {name!r} is not declared")
    if event_type.legacy:
        raise UnknownEventType(f"event type {name!r} is no longer written")
    try:
        event_type.payload.model_validate(payload)
    except ValidationError as exc:
        raise InvalidPayload(f"{name}: {exc}") from exc


def reduce_snapshot(
    snapshot: dict[str, Any], name: str, payload: dict[str, Any]
) -> dict[str, Any] | None:
    step = get(name).snapshot
    return step(snapshot, payload) if step is not None else None


def summary(name: str, payload: dict[str, Any]) -> str:
    words = get(name).summary
    return words(payload) if words is not None else ""


def timeline_line(name: str, payload: dict[str, Any]) -> str:
    """The template partial that shows this event on a timeline."""
    line = get(name).line
    chosen = str(line(payload) if callable(line) else line)
    return chosen if "#" in chosen else f"{EVENT_LINES_TEMPLATE}#{chosen}"


def possible_lines() -> set[str]:
    """Every timeline line a declared type or finding kind can give."""
    found: set[str] = set()
    lines = [t.line for t in _TYPES.values()] + [k.line for k in _KINDS.values()]
    for line in lines:
        if isinstance(line, str):
            found.add(line)
        elif isinstance(line, ByKey):
            found |= line.lines()
    return found


def is_internal(name: str, payload: dict[str, Any]) -> bool:
    internal = get(name).internal
    return bool(internal(payload) if callable(internal) else internal)


def panels(name: str) -> frozenset[str]:
    return get(name).panels


# --- findings: what an analysis found, of a kind a domain declares --------------------


@dataclass(frozen=True)
class FindingKind:
    """A kind of `finding.recorded` (risk, impact, a hypothesis, a root cause): declared by
    the domain that finds it, with its own payload model, words and timeline line. The
    snapshot keeps a session's latest finding of each kind under the kind's name."""

    kind: str
    payload: type[BaseModel] = Payload
    summary: Summary | None = None
    line: str | ByKey = "other"


_KINDS: dict[str, FindingKind] = {}
_NO_KIND = FindingKind(kind="")


def register_finding(*kinds: FindingKind) -> None:
    for kind in kinds:
        held = _KINDS.get(kind.kind)
        if held is not None and held != kind:
            raise RuntimeError(f"finding kind {kind.kind!r} is declared twice")
        _KINDS[kind.kind] = kind


def finding_kind(kind: str) -> FindingKind:
    return _KINDS.get(kind, _NO_KIND)


def finding_kinds() -> Mapping[str, FindingKind]:
    return _KINDS


def mask_rules() -> list[dict[str, Any]]:
    """The masking the declarations ask for, as diagnosis.eventlog.masking's rules."""
    return [
        {"types": [t.name], "fields": list(t.masked), "risk_classes": list(t.masked_at)}
        for t in _TYPES.values()
        if t.masked
    ]
