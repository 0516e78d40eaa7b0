"""The apron's findings: `finding.recorded` of kind `risk` (the first risk rule that
matched) and `impact` (what the spread reaches from the incident's position), declared
with their payload models, words and timeline lines. Sessions logged before findings were
generic hold them as `risk.assessed` / `impact.analyzed`: declared here as read-only
legacy types that fold, read and render as findings of the same kinds."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _

from diagnosis.eventlog.registry import FindingKind, Payload
from diagnosis.eventlog.types.findings import legacy_finding

RISK = "risk"
IMPACT = "impact"
# The names the apron wrote its findings under before `finding.recorded`.
RISK_ASSESSED = "risk.assessed"
IMPACT_ANALYZED = "impact.analyzed"

LINES = "airport/_lines.html"


class RiskFinding(Payload):
    level: str
    score: int | float | None = None
    rule: str | None = None
    when: dict[str, Any] = {}
    # After a correction (or an optional answer): the risk before it, and what changed.
    reassessed_from: dict[str, Any] | None = None
    corrected: dict[str, Any] = {}
    answered: dict[str, Any] = {}


class ImpactFinding(Payload):
    start: str | None = None
    radius: int | None = None
    isolated_nodes: list[Any] = []


def _risk_words(p: dict[str, Any]) -> str:
    return _("risk %(level)s %(score)s by rule %(rule)s") % {
        "level": p.get("level"),
        "score": p.get("score"),
        "rule": p.get("rule"),
    }


def _impact_words(p: dict[str, Any]) -> str:
    return _("radius %(radius)s from %(start)s") % {
        "radius": p.get("radius"),
        "start": p.get("start"),
    }


KINDS = (
    FindingKind(RISK, RiskFinding, summary=_risk_words, line=f"{LINES}#risk"),
    FindingKind(IMPACT, ImpactFinding, summary=_impact_words, line=f"{LINES}#impact"),
)
LEGACY_TYPES = (legacy_finding(RISK_ASSESSED, RISK), legacy_finding(IMPACT_ANALYZED, IMPACT))
