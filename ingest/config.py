"""Gate configuration as immutable snapshots (seed 002).

The read path (`provider.current()`) returns the snapshot reference without a lock.
A reload builds a complete new snapshot, validates it, and swaps the reference in one
assignment; a snapshot that fails validation is not swapped in: the old one stays, the
error is logged and kept for the admin pages.

Sources: the database (GateSettings + GateRule, edited in admin; every save bumps
GateSettings.revision) or, when AERO_GATE_FILE is set, a YAML file watched by stamp
(mtime_ns + size) and, when the stamp changed, by content hash. Every process checks its
source at most once a second, so a save in one web process reaches the others.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from django.conf import settings
from django.utils import timezone

logger = logging.getLogger("ingest.config")

ACTIONS = ("auto", "deliver", "sink", "drop")
CHECK_EVERY = 1.0  # seconds between source checks on the read path


class ConfigError(ValueError):
    """The gate configuration is invalid; the message says where."""


@dataclass(frozen=True)
class RuleSnapshot:
    id: int | None
    name: str
    matchers: tuple[tuple[str, re.Pattern[str]], ...]
    scenario_slug: str | None
    base_score: int
    action: str
    group_by: tuple[str, ...]

    def matches(self, labels: dict[str, str]) -> bool:
        return all(pattern.fullmatch(labels.get(label, "")) for label, pattern in self.matchers)


@dataclass(frozen=True)
class GateSnapshot:
    version: str  # "db:<revision>" or "file:<sha256 prefix>"
    deliver_threshold: int
    sink_threshold: int
    dedup_window_seconds: int
    severity_scores: MappingProxyType[str, int]
    unmatched: str
    rules: tuple[RuleSnapshot, ...]
    loaded_at: float = field(default_factory=time.time)

    def match(self, labels: dict[str, str]) -> RuleSnapshot | None:
        for rule in self.rules:
            if rule.matches(labels):
                return rule
        return None


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where} must be an integer from {low} to {high}, not {value!r}")
    return value


def build_snapshot(
    version: str, gate: dict[str, Any], rules: list[dict[str, Any]], active_scenarios: set[str]
) -> GateSnapshot:
    """Validate plain data into a snapshot; raises ConfigError naming the bad part."""
    deliver = _int(gate.get("deliver_threshold", 50), "deliver_threshold", 0, 1000)
    sink = _int(gate.get("sink_threshold", 20), "sink_threshold", 0, 1000)
    if sink > deliver:
        raise ConfigError(f"sink_threshold ({sink}) is above deliver_threshold ({deliver})")
    window = _int(gate.get("dedup_window_seconds", 300), "dedup_window_seconds", 0, 7 * 86400)
    scores = gate.get("severity_scores") or {}
    if not isinstance(scores, dict):
        raise ConfigError("severity_scores must be a mapping of severity -> points")
    severity = {str(k): _int(v, f"severity_scores.{k}", 0, 1000) for k, v in scores.items()}
    unmatched = gate.get("unmatched", "sink")
    if unmatched not in ("sink", "drop"):
        raise ConfigError(f"unmatched must be sink or drop, not {unmatched!r}")
    built: list[RuleSnapshot] = []
    names: set[str] = set()
    for index, rule in enumerate(rules):
        name = str(rule.get("name") or f"rule {index + 1}")
        where = f"rule {name!r}"
        if name in names:
            raise ConfigError(f"{where}: the name is used twice")
        names.add(name)
        matchers = rule.get("matchers") or {}
        if not isinstance(matchers, dict):
            raise ConfigError(f"{where}: matchers must be a mapping of label -> regex")
        compiled = []
        for label, pattern in matchers.items():
            try:
                compiled.append((str(label), re.compile(str(pattern))))
            except re.error as exc:
                raise ConfigError(f"{where}: bad regex for {label}: {exc}") from exc
        action = rule.get("action", "auto")
        if action not in ACTIONS:
            raise ConfigError(f"{where}: action must be one of {', '.join(ACTIONS)}")
        scenario = rule.get("scenario") or None
        if scenario is not None and scenario not in active_scenarios:
            raise ConfigError(f"{where}: scenario {scenario!r} does not exist or is not active")
        if action == "deliver" and scenario is None:
            raise ConfigError(f"{where}: always-deliver needs a scenario to open sessions in")
        group_by = rule.get("group_by") or []
        if not isinstance(group_by, list) or not all(isinstance(g, str) for g in group_by):
            raise ConfigError(f"{where}: group_by must be a list of label names")
        built.append(
            RuleSnapshot(
                id=rule.get("id"),
                name=name,
                matchers=tuple(compiled),
                scenario_slug=scenario,
                base_score=_int(rule.get("base_score", 0), f"{where}: base_score", 0, 1000),
                action=action,
                group_by=tuple(group_by),
            )
        )
    return GateSnapshot(
        version=version,
        deliver_threshold=deliver,
        sink_threshold=sink,
        dedup_window_seconds=window,
        severity_scores=MappingProxyType(severity),
        unmatched=unmatched,
        rules=tuple(built),
    )


def _active_scenarios() -> set[str]:
    from scenarios_admin.models import Scenario

    return set(Scenario.objects.filter(is_active=True).values_list("slug", flat=True))


def snapshot_from_db() -> GateSnapshot:
    from ingest.models import GateRule, GateSettings

    gate = GateSettings.load()
    rules = [
        {
            "id": rule.pk,
            "name": rule.name,
            "matchers": rule.matchers,
            "scenario": rule.scenario.slug if rule.scenario else None,
            "base_score": rule.base_score,
            "action": rule.action,
            "group_by": rule.group_by,
        }
        for rule in GateRule.objects.filter(enabled=True).select_related("scenario")
    ]
    return build_snapshot(
        f"db:{gate.revision}",
        {
            "deliver_threshold": gate.deliver_threshold,
            "sink_threshold": gate.sink_threshold,
            "dedup_window_seconds": gate.dedup_window_seconds,
            "severity_scores": gate.severity_scores,
            "unmatched": gate.unmatched,
        },
        rules,
        _active_scenarios(),
    )


def snapshot_from_file(text: str) -> GateSnapshot:
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"the gate file is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError("the gate file must be a mapping with 'gate' and 'rules'")
    gate = data.get("gate") or {}
    rules = data.get("rules") or []
    if not isinstance(gate, dict) or not isinstance(rules, list):
        raise ConfigError("'gate' must be a mapping and 'rules' a list")
    if not all(isinstance(rule, dict) for rule in rules):
        raise ConfigError("every rule must be a mapping")
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return build_snapshot(f"file:{digest}", gate, rules, _active_scenarios())


class GateConfigProvider:
    def __init__(self) -> None:
        self._snapshot: GateSnapshot | None = None
        self._reloading = threading.Lock()
        self._checked_at = 0.0
        self._file_stamp: tuple[int, int] | None = None
        self._file_hash = ""
        self._failed_version: str | None = None
        self.last_error = ""
        self.last_error_at: Any = None

    # --- the read path: no lock ---------------------------------------------------------

    def current(self) -> GateSnapshot:
        snapshot = self._snapshot
        if snapshot is None or time.monotonic() - self._checked_at >= CHECK_EVERY:
            self._check_source()
            snapshot = self._snapshot
        if snapshot is None:
            raise ConfigError(self.last_error or "the gate has no valid configuration")
        return snapshot

    # --- reloads ----------------------------------------------------------------------

    def _check_source(self) -> None:
        self._checked_at = time.monotonic()
        path = settings.AERO_GATE_FILE
        if path:
            self._check_file(Path(path))
            return
        from ingest.models import GateSettings

        revision = GateSettings.objects.filter(pk=1).values_list("revision", flat=True).first()
        version = f"db:{revision or 0}"
        current = self._snapshot.version if self._snapshot else None
        # A revision that failed validation is not retried every second: the next save
        # (a new revision) is.
        if version not in (current, self._failed_version) and not self._swap(snapshot_from_db):
            self._failed_version = version

    def _check_file(self, path: Path) -> None:
        try:
            stat = path.stat()
        except OSError as exc:
            self._failed(f"cannot read the gate file {path}: {exc}")
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._file_stamp and self._snapshot is not None:
            return
        text = path.read_text(encoding="utf-8")
        digest = hashlib.sha256(text.encode()).hexdigest()
        self._file_stamp = stamp
        if digest == self._file_hash and self._snapshot is not None:
            return  # touched, not changed
        self._file_hash = digest
        self._swap(lambda: snapshot_from_file(text))

    def reload(self) -> bool:
        """Rebuild from the source now (admin saves call this after commit). Returns
        whether a new snapshot is in place."""
        path = settings.AERO_GATE_FILE
        if path:
            self._file_stamp = None
            self._file_hash = ""
            before = self._snapshot
            self._check_file(Path(path))
            return self._snapshot is not before and not self.last_error
        self._checked_at = time.monotonic()
        return self._swap(snapshot_from_db)

    def _swap(self, build: Any) -> bool:
        if not self._reloading.acquire(timeout=5):
            return False
        try:
            try:
                snapshot = build()
            except ConfigError as exc:
                self._failed(str(exc))
                return False
            self._snapshot = snapshot  # one reference assignment: readers see old or new
            self.last_error = ""
            self.last_error_at = None
            self._failed_version = None
            logger.info(
                "gate configuration %s loaded (%d rules)", snapshot.version, len(snapshot.rules)
            )
            return True
        finally:
            self._reloading.release()

    def _failed(self, message: str) -> None:
        kept = self._snapshot.version if self._snapshot else "none"
        self.last_error = message
        self.last_error_at = timezone.now()
        logger.error("gate configuration reload failed, keeping %s: %s", kept, message)

    def reset(self) -> None:
        """Forget everything (tests)."""
        self._snapshot = None
        self._checked_at = 0.0
        self._file_stamp = None
        self._file_hash = ""
        self._failed_version = None
        self.last_error = ""


provider = GateConfigProvider()
