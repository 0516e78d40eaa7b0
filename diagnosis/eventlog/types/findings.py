"""What an analysis found: `finding.recorded` of a kind (risk, impact, a hypothesis, a
root cause), the kind declared by the domain that finds it with its payload model, words
and timeline line. A domain that once wrote a finding under a name of its own declares
that name as a legacy finding type (`legacy_finding`): its old logs still fold, read and
render as findings of the kind."""

from __future__ import annotations

from typing import Any

from pydantic import model_validator

from diagnosis.eventlog import names, registry
from diagnosis.eventlog.registry import EventType, Payload

FACTS = frozenset({"session-facts"})


class FindingRecorded(Payload):
    kind: str

    @model_validator(mode="after")
    def _fits_its_kind(self) -> FindingRecorded:
        declared = registry.finding_kinds().get(self.kind)
        if declared is None:
            raise ValueError(f"finding kind {self.kind!r} is not declared")
        declared.payload.model_validate(self.model_extra or {})
        return self


def body(payload: dict[str, Any]) -> dict[str, Any]:
    """A finding as the snapshot keeps it: the payload without its kind."""
    return {k: v for k, v in payload.items() if k != "kind"}


def recorded(kind: str, finding: dict[str, Any]) -> dict[str, Any]:
    """The payload of a `finding.recorded` of `kind` (a finding holds no key `kind`)."""
    return {"kind": kind, **finding}


def _finding_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    return {**snapshot, str(p["kind"]): body(p)}


def _finding_words(p: dict[str, Any]) -> str:
    words = registry.finding_kind(str(p.get("kind"))).summary
    return words(body(p)) if words is not None else ""


def _finding_line(p: dict[str, Any]) -> str:
    line = registry.finding_kind(str(p.get("kind"))).line
    return str(line(body(p)) if callable(line) else line)


def legacy_finding(name: str, kind: str) -> EventType:
    """A finding event written under a domain's own name before `finding.recorded`: read
    only, it folds, reads and renders exactly as a finding of `kind` (its payload is the
    finding without the kind)."""

    def as_finding(p: dict[str, Any]) -> dict[str, Any]:
        return recorded(kind, p)

    return EventType(
        name,
        snapshot=lambda snapshot, p: {**snapshot, kind: dict(p)},
        summary=lambda p: _finding_words(as_finding(p)),
        line=lambda p: _finding_line(as_finding(p)),
        panels=FACTS,
        legacy=True,
    )


TYPES = (
    EventType(
        names.FINDING_RECORDED,
        FindingRecorded,
        snapshot=_finding_snapshot,
        summary=_finding_words,
        line=_finding_line,
        panels=FACTS,
    ),
)
