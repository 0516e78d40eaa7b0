"""The gate (seed 002): synchronous, fast, deterministic stages that turn
one alert into DROP, SINK or DELIVER, naming the stage that decided. It never calls the
agent: delivering is ingest.actions' job. The only state it reads is "which kept
observation, if any, does this alert repeat", passed in as a function, so the stages are
testable as plain data."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ingest.config import GateSnapshot, RuleSnapshot
from ingest.schemas import AlertmanagerAlert, AlertmanagerPayload, GenericAlert, GenericPayload

DROP, SINK, DELIVER = "drop", "sink", "deliver"
FIRING, RESOLVED = "firing", "resolved"


@dataclass(frozen=True)
class Alert:
    source: str  # "alertmanager", "generic", "agent:<name>"
    status: str  # firing | resolved
    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    fingerprint: str = ""
    group_key: str = ""  # Alertmanager's groupKey; generic alerts get one from the rule
    actor: str = ""
    starts_at: datetime | None = None

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    def label_fingerprint(self) -> str:
        """Alertmanager's idea of identity: the label set (when the sender gave none)."""
        canonical = json.dumps(dict(sorted(self.labels.items())), separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Verdict:
    decision: str
    stage: str
    reason: str
    score: int = 0
    rule: RuleSnapshot | None = None
    fingerprint: str = ""
    group_key: str = ""
    repeats: Any = None  # what a dedup drop repeats (RepeatOf's answer), else None


# (fingerprint, group key, status, startsAt, window) -> the kept observation of the same
# open episode this alert repeats, or None. An episode opens with a firing and ends with
# its resolution, a new startsAt or the end of its session: only inside one is an alert
# a repeat, so a new incident is never dropped as one.
RepeatOf = Callable[[str, str, str, datetime | None, int], Any]


def is_own_output(alert: Alert) -> bool:
    """The agent's own messages never re-enter as observations."""
    return (
        alert.source.startswith("agent:")
        or alert.actor == "agent"
        or alert.labels.get("aero_origin") == "agent"
    )


def group_key_for(alert: Alert, rule: RuleSnapshot | None) -> str:
    if alert.group_key:
        return alert.group_key[:255]
    labels = rule.group_by if rule and rule.group_by else ("alertname",)
    parts = ",".join(f"{name}={alert.labels.get(name, '')}" for name in labels)
    return f"{alert.source}:{rule.name if rule else '-'}:{{{parts}}}"[:255]


def decide(alert: Alert, config: GateSnapshot, repeat_of: RepeatOf) -> Verdict:
    fingerprint = alert.fingerprint or alert.label_fingerprint()
    # 1. loop guard
    if is_own_output(alert):
        return Verdict(DROP, "loop", "the agent's own output never re-enters", 0, None, fingerprint)
    # 2. match a scenario
    rule = config.match(dict(alert.labels))
    group_key = group_key_for(alert, rule)
    # 3. score
    severity = alert.labels.get("severity", "")
    score = rule.base_score + config.severity_scores.get(severity, 0) if rule else 0
    # 4. deduplicate: a repeat of a kept alert within its open episode and the window
    # (unmatched alerts too: a sink must not fill with one alert's repeats)
    repeated = (
        repeat_of(
            fingerprint, group_key, alert.status, alert.starts_at, config.dedup_window_seconds
        )
        if config.dedup_window_seconds
        else None
    )
    if repeated is not None:
        return Verdict(
            DROP,
            "dedup",
            f"repeat within its open episode and {config.dedup_window_seconds} s",
            score,
            rule,
            fingerprint,
            group_key,
            repeated,
        )
    if rule is None:
        return Verdict(
            config.unmatched, "match", "no gate rule matches", 0, None, fingerprint, group_key
        )
    # 5. policy
    if rule.action != "auto":
        decision, reason = rule.action, f"rule {rule.name!r} always {rule.action}s"
    elif score >= config.deliver_threshold:
        decision, reason = DELIVER, f"score {score} >= deliver threshold {config.deliver_threshold}"
    elif score >= config.sink_threshold:
        decision, reason = SINK, f"score {score} >= sink threshold {config.sink_threshold}"
    else:
        decision, reason = DROP, f"score {score} below sink threshold {config.sink_threshold}"
    if decision == DELIVER and rule.scenario_slug is None:
        decision, reason = SINK, f"rule {rule.name!r} routes to no scenario"
    return Verdict(decision, "policy", reason, score, rule, fingerprint, group_key)


def from_alertmanager(payload: AlertmanagerPayload, item: AlertmanagerAlert) -> Alert:
    """One alert of an Alertmanager webhook group (payload version 4)."""
    return Alert(
        source="alertmanager",
        status=item.status,
        labels={**payload.commonLabels, **item.labels},
        annotations={**payload.commonAnnotations, **item.annotations},
        fingerprint=item.fingerprint,
        group_key=payload.groupKey[:255],
        starts_at=item.startsAt,
    )


def from_generic(payload: GenericPayload, item: GenericAlert) -> Alert:
    return Alert(
        source=item.source,
        status=item.status,
        labels=item.labels,
        annotations=item.annotations,
        fingerprint=item.fingerprint,
        group_key=item.group_key,
        actor=item.actor,
        starts_at=item.starts_at,
    )


def describe(alert: Alert) -> str:
    """The text a delivered alert opens its session with: what a person would report."""
    annotations = alert.annotations
    text = annotations.get("description") or annotations.get("summary") or alert.name
    context = ", ".join(
        f"{k}={v}" for k, v in sorted(alert.labels.items()) if k not in ("alertname", "severity")
    )
    head = f"[{alert.source}] {alert.name}".strip()
    return f"{head}: {text}" + (f" ({context})" if context else "")
