"""What an analysis found: `finding.recorded` of a kind (risk, impact, ...), the kind
declared by the domain that finds it; and the older, domain-named types that logs written
before it still hold (`risk.assessed`, `impact.analyzed`), read as findings of their
kind."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _
from pydantic import model_validator

from diagnosis.eventlog import names, registry
from diagnosis.eventlog.names import IMPACT_ANALYZED, RISK_ASSESSED
from diagnosis.eventlog.registry import EventType, FindingKind, Payload

FACTS = frozenset({"session-facts"})
# The names of the domain-named finding events, by the finding kind they recorded.
LEGACY_FINDINGS = {"risk": RISK_ASSESSED, "impact": IMPACT_ANALYZED}


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


def _finding_snapshot(snapshot: dict[str, Any], p: dict[str, Any]) -> dict[str, Any]:
    return {**snapshot, str(p["kind"]): body(p)}


def _finding_words(p: dict[str, Any]) -> str:
    words = registry.finding_kind(str(p.get("kind"))).summary
    return words(body(p)) if words is not None else ""


def _finding_line(p: dict[str, Any]) -> str:
    line = registry.finding_kind(str(p.get("kind"))).line
    return str(line(body(p)) if callable(line) else line)


def _legacy(kind: str) -> EventType:
    """A domain-named finding event: folds, reads and renders as a finding of `kind`."""

    def as_finding(p: dict[str, Any]) -> dict[str, Any]:
        return {"kind": kind, **p}

    return EventType(
        LEGACY_FINDINGS[kind],
        snapshot=lambda snapshot, p: {**snapshot, kind: dict(p)},
        summary=lambda p: _finding_words(as_finding(p)),
        line=lambda p: _finding_line(as_finding(p)),
        panels=FACTS,
    )


class RiskFinding(Payload):
    level: str
    score: int | float | None = None
    rule: str | None = None
    when: dict[str, Any] = {}


class ImpactFinding(Payload):
    start: str | None = None
    radius: int | None = None
    isolated_nodes: list[Any] = []


KINDS = (
    FindingKind(
        "risk",
        RiskFinding,
        summary=lambda p: (
            _("risk %(level)s %(score)s by rule %(rule)s")
            % {"level": p.get("level"), "score": p.get("score"), "rule": p.get("rule")}
        ),
        line="risk-assessed",
    ),
    FindingKind(
        "impact",
        ImpactFinding,
        summary=lambda p: (
            _("radius %(radius)s from %(start)s")
            % {"radius": p.get("radius"), "start": p.get("start")}
        ),
        line="impact-analyzed",
    ),
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
    _legacy("risk"),
    _legacy("impact"),
)
