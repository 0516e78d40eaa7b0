"""The diagnosis pack's finding kinds (`finding.recorded` of kind `hypothesis` or
`root_cause`): declared with their payload models and words, so the core's fold,
timeline and export read them like the airport's risk and impact."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext as _

from diagnosis.eventlog.registry import FindingKind, Payload


class HypothesisFinding(Payload):
    hypothesis: str
    service: str
    rank: int
    conditions: list[str] = []


class CodeLocationPayload(Payload):
    path: str
    line: int


class RootCauseFinding(Payload):
    hypothesis: str
    service: str | None = None
    deploy: str | None = None
    commit: str | None = None  # the commit blamed (a system's repository, no deploy record)
    config_key: str | None = None
    summary: dict[str, str] = {}
    confidence: float
    problem_type: str
    related_services: list[str] = []
    code_locations: list[CodeLocationPayload] = []
    evidence: list[str] = []  # the ids of the evidence calls it rests on
    missing: list[str] = []


def _root_cause_words(p: dict[str, Any]) -> str:
    return _("root cause %(hypothesis)s on %(service)s, confidence %(confidence)s") % {
        "hypothesis": p.get("hypothesis"),
        "service": p.get("service") or "-",
        "confidence": p.get("confidence"),
    }


def _hypothesis_words(p: dict[str, Any]) -> str:
    return _("candidate %(hypothesis)s on %(service)s") % {
        "hypothesis": p.get("hypothesis"),
        "service": p.get("service"),
    }


KINDS = (
    FindingKind(
        "root_cause",
        RootCauseFinding,
        summary=_root_cause_words,
        line="diagnosis_pack/_lines.html#root-cause",
    ),
    FindingKind(
        "hypothesis",
        HypothesisFinding,
        summary=_hypothesis_words,
        line="diagnosis_pack/_lines.html#hypothesis",
    ),
)
