"""The offline playbook (DIAGNOSIS.md §3): from a bundle's evidence to a root cause with
confidence, code locations, related services and one fix action.

Deterministic and data-driven: every threshold, hypothesis, action and text comes from
the `Playbook` model (the pack's data). A model may reason further, never against it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from statistics import median
from typing import Any

from packs.diagnosis import prometheus
from packs.diagnosis.bundle import Bundle, Commit, ConfigChange, Deploy
from packs.diagnosis.evidence import Evidence, Signature
from packs.diagnosis.playbook_data import (
    ANOMALY_METRICS,
    MAX_CHANGED_LINES,
    RANKS,
    READ_METRICS,
    STATE_METRICS,
    Anomaly,
    CodeLocation,
    Diagnosis,
    Finding,
    Playbook,
    default_playbook,
)
from packs.diagnosis.prometheus import PrometheusSource, Sample
from packs.diagnosis.system import System


def read_metrics(
    source: PrometheusSource, bundle: Bundle, playbook: Playbook | None = None
) -> list[Sample]:
    """The samples the playbook reads for `bundle`'s incident from a metrics source: its
    metrics over the window, widened by the state window on both sides (a state is read
    around T0). MetricsSourceError when the source fails."""
    since, until = metrics_window(bundle, playbook)
    return prometheus.samples(source, list(READ_METRICS), since, until)


def metrics_window(bundle: Bundle, playbook: Playbook | None = None) -> tuple[datetime, datetime]:
    """What a metrics source is read over: the window widened by the state window."""
    rules = playbook or default_playbook()
    start, end = bundle.incident.window_bounds(rules.window_minutes)
    since = start - timedelta(minutes=rules.state_window.before_minutes)
    until = end + timedelta(minutes=rules.state_window.after_minutes)
    return since, until


def diagnose(bundle: Bundle, system: System, playbook: Playbook | None = None) -> Diagnosis:
    evidence = Evidence(bundle)
    try:
        return _Diagnoser(bundle, system, playbook or default_playbook(), evidence).run()
    finally:
        evidence.close()


class _Diagnoser:
    def __init__(self, bundle: Bundle, system: System, playbook: Playbook, evidence: Evidence):
        self.bundle, self.system, self.rules, self.evidence = bundle, system, playbook, evidence
        self.start, self.end = bundle.incident.window_bounds(playbook.window_minutes)
        self.anomalous: set[str] = set()
        self.onsets: dict[str, datetime] = {}

    def run(self) -> Diagnosis:
        anomalies = self.anomalies()
        self.anomalous = {a.service for a in anomalies}
        for a in anomalies:  # sorted by onset: each service's first
            self.onsets.setdefault(a.service, a.onset)
        t0 = min((a.onset for a in anomalies), default=self.bundle.incident.reported_at)
        signatures = self.evidence.log_signatures(since=self.start, until=self.end)
        new_since = t0 - timedelta(minutes=self.rules.signature.new_since_minutes)
        new = [
            s
            for s in signatures
            if s.first_seen >= new_since and s.count >= self.rules.signature.min_count
        ]
        pointers = {id(s): self.points_at(s) for s in new}
        edges: dict[str, set[str]] = {}
        for s in new:
            target = pointers[id(s)]
            if target and target != s.service:
                edges.setdefault(s.service, set()).add(target)
        anomalous = sorted({a.service for a in anomalies})
        candidates = self.deepest(anomalous, edges)
        findings = [f for c in candidates for f in self.findings_for(c, t0, new, pointers, edges)]
        findings.sort(key=lambda f: (f.rank, -len(self.pointed_by(f.service, edges)), f.service))
        missing = [name for name, present in self.source_presence().items() if not present]
        best = findings[0] if findings else None
        return self.conclusion(best, t0, anomalies, new, candidates, findings, edges, missing)

    # Anomalies --------------------------------------------------------------------
    def anomalies(self) -> list[Anomaly]:
        mid = self.start + (self.end - self.start) / 2
        rules = self.rules.anomaly
        out: list[Anomaly] = []
        series = self.evidence.series(list(ANOMALY_METRICS), since=self.start, until=self.end)
        for (service, metric), samples in series.items():
            baseline = _median([v for ts, v in samples if ts < mid])
            if metric == "http_error_ratio":
                limit = max(rules.http_error_ratio.floor, rules.http_error_ratio.factor * baseline)
                breach = [v > limit for _, v in samples]
            elif metric == "latency_p99_ms":
                breach = [v > rules.latency_p99_ms.factor * baseline for _, v in samples]
            else:
                breach = [v == 0 for _, v in samples]
            onset = _first_run(breach, rules.consecutive)
            if onset is not None:
                peak = max(v for _, v in samples[onset:]) if metric != "up" else 0.0
                out.append(Anomaly(service, metric, samples[onset][0], baseline, peak))
        # Services that log but have no metrics: their ERROR records a minute.
        quiet = sorted(self.evidence.log_services() - self.evidence.metric_services())
        per_minute = self.evidence.errors_per_minute(quiet, self.start, self.end)
        minutes = minutes_between(self.start, self.end)
        rule = rules.log_errors_per_minute
        for service, counts in per_minute.items():
            values = [counts.get(m, 0) for m in minutes]
            baseline = _median([v for m, v in zip(minutes, values, strict=True) if m < mid])
            limit = max(rule.floor, rule.factor * baseline)
            onset = _first_run([v >= limit for v in values], rules.consecutive)
            if onset is not None:
                out.append(
                    Anomaly(
                        service,
                        "log_errors_per_minute",
                        minutes[onset],
                        baseline,
                        max(values[onset:]),
                    )
                )
        return sorted(out, key=lambda a: (a.onset, a.service, a.metric))

    # Pointers and candidates ------------------------------------------------------
    def points_at(self, signature: Signature) -> str | None:
        if signature.upstream:
            return signature.upstream
        text = f" {signature.sample.lower()} "
        for dependency in self.system.dependencies(signature.service):
            if _names(text, dependency):
                return dependency
        return None

    @staticmethod
    def pointed_by(service: str, edges: dict[str, set[str]]) -> list[str]:
        return sorted(s for s, targets in edges.items() if service in targets)

    @staticmethod
    def deepest(starts: list[str], edges: dict[str, set[str]]) -> list[str]:
        """Following pointers from every anomalous service: the services where they end."""
        sinks: set[str] = set()
        for start in starts:
            seen, stack = {start}, [start]
            while stack:
                node = stack.pop()
                onward = [t for t in sorted(edges.get(node, ())) if t not in seen]
                if not edges.get(node):
                    sinks.add(node)
                for target in onward:
                    seen.add(target)
                    stack.append(target)
        return sorted(sinks)

    def reaches(self, start: str, target: str, edges: dict[str, set[str]]) -> bool:
        seen, stack = {start}, [start]
        while stack:
            node = stack.pop()
            if node == target:
                return True
            for onward in edges.get(node, ()):
                if onward not in seen:
                    seen.add(onward)
                    stack.append(onward)
        return False

    # Findings ---------------------------------------------------------------------
    def findings_for(
        self,
        service: str,
        t0: datetime,
        new: list[Signature],
        pointers: dict[int, str | None],
        edges: dict[str, set[str]],
    ) -> list[Finding]:
        hyp = self.rules.hypotheses
        since = t0 - timedelta(minutes=self.rules.state_window.before_minutes)
        until = t0 + timedelta(minutes=self.rules.state_window.after_minutes)
        state = self.evidence.series(
            list(STATE_METRICS), since=since, until=until, services=[service]
        )
        values = {metric: samples for (_, metric), samples in state.items()}
        callers_point = bool(self.pointed_by(service, edges))
        out: list[Finding] = []

        def add(name: str, rank: str, conditions: list[str], **kw: Any) -> None:
            if name in hyp:
                out.append(Finding(name, service, RANKS[rank], conditions, **kw))

        pointing = ["callers_point_at_it"]
        if (
            self.system.kind(service) == "database"
            and callers_point
            and any(v == 0 for _, v in values.get("up", []))
        ):
            add(
                "db_primary_down",
                "state",
                ["state_finding", *pointing],
                detail={"metric": "up"},
            )
        cert = hyp.get("cert_expired")
        if (
            cert
            and callers_point
            and any(v <= (cert.threshold or 0) for _, v in values.get("tls_cert_days_left", []))
        ):
            add(
                "cert_expired",
                "state",
                ["state_finding", *pointing],
                detail={"metric": "tls_cert_days_left"},
            )
        disk = hyp.get("disk_full")
        if disk and any(v >= (disk.threshold or 1) for _, v in values.get("disk_used_ratio", [])):
            add("disk_full", "state", ["state_finding"], detail={"metric": "disk_used_ratio"})
        pool = hyp.get("db_pool_exhausted")
        if pool and _paired_at_least(
            values.get("db_connections_in_use", []),
            values.get("db_connections_max", []),
            pool.threshold or 1,
        ):
            add(
                "db_pool_exhausted",
                "state",
                ["state_finding"],
                detail={"metric": "db_connections_in_use"},
            )
        leak = hyp.get("memory_leak")
        restarts = [v for _, v in values.get("restarts_total", [])]
        if (
            leak
            and restarts
            and max(restarts) > min(restarts)
            and _paired_at_least(
                values.get("memory_rss_mb", []),
                values.get("memory_limit_mb", []),
                leak.threshold or 1,
            )
        ):
            add("memory_leak", "state", ["state_finding"], detail={"metric": "memory_rss_mb"})

        own = [s for s in new if s.service == service and pointers[id(s)] is None]
        window = timedelta(minutes=self.rules.change_window_minutes)
        changes: list[tuple[str, Deploy | ConfigChange]] = [
            ("bad_deploy", d)
            for d in self.evidence.deploys(service=service, since=t0 - window, until=t0)
        ] + [
            ("config_change", c)
            for c in self.evidence.config_changes(service=service, since=t0 - window, until=t0)
        ]
        for name, change in changes:
            after = [s for s in own if s.first_seen > change.at]
            named = [s for s in after if _change_named(change, s)]
            if not after:
                continue
            signature = (named or after)[0]
            rank = "change_named" if named else "change_by_time"
            conditions = ["new_signature_on_service"]
            conditions.append("change_in_stack_or_message" if named else "change_by_time")
            add(name, rank, conditions, change=change, signature=signature)
        for commit in self.commits_on(service, since=t0 - window, until=t0):
            after = [s for s in own if s.first_seen > commit.at]
            named = [s for s in after if any(f.path in commit.files for f in s.frames)]
            onset = self.onsets.get(service)
            if after:
                rank = "change_named" if named else "change_by_time"
                conditions = ["new_signature_on_service"]
                conditions.append("change_in_stack_or_message" if named else "change_by_time")
            elif onset is not None and onset >= commit.at:
                # No logs to name it: its service's anomaly began after it, in the window.
                rank, conditions = "change_by_time", ["change_by_time"]
            else:
                continue
            blamed = (named or after)[0] if after else None
            add("bad_commit", rank, conditions, change=commit, signature=blamed)

        if not out and callers_point:
            add("upstream_degraded", "upstream", pointing)
        for finding in out:
            if service in self.anomalous:
                finding.conditions.append("anomaly_on_service")
            if callers_point and "callers_point_at_it" not in finding.conditions:
                finding.conditions.append("callers_point_at_it")
        return out

    def commits_on(self, service: str, *, since: datetime, until: datetime) -> list[Commit]:
        """The commits read from the system's repository that changed `service`'s code
        (a file under its `repo_dir`) between `since` and `until`, the latest first."""
        spec = self.system.services.get(service)
        folder = spec.repo_dir.strip("/") + "/" if spec is not None and spec.repo_dir else ""
        if not folder:
            return []
        found = [
            c
            for c in self.bundle.commits or []
            if since <= c.at <= until and any(path.startswith(folder) for path in c.files)
        ]
        return sorted(found, key=lambda c: c.at, reverse=True)

    def source_presence(self) -> dict[str, bool]:
        sources = self.bundle.sources
        return {
            "logs": sources["logs"],
            "metrics": sources["metrics"],
            "changes": sources["deploys"]
            or sources["config_changes"]
            or sources.get("commits", False),
        }

    # The conclusion -----------------------------------------------------------------
    def conclusion(
        self,
        best: Finding | None,
        t0: datetime,
        anomalies: list[Anomaly],
        new: list[Signature],
        candidates: list[str],
        findings: list[Finding],
        edges: dict[str, set[str]],
        missing: list[str],
    ) -> Diagnosis:
        name = best.hypothesis if best else "unknown"
        service = best.service if best else None
        change = best.change if best else None
        deploy = change.id if isinstance(change, Deploy) else None
        commit = change.commit if isinstance(change, Commit) else None
        config_key = change.key if isinstance(change, ConfigChange) else None
        related = (
            sorted(
                {
                    service,
                    *(a.service for a in anomalies if self.reaches(a.service, service, edges)),
                }
            )
            if service
            else []
        )
        code = []
        if isinstance(change, Deploy) and best and best.signature:
            files = set(change.files)
            seen: set[tuple[str, int]] = set()
            for s in new:
                if s.service != service:
                    continue
                for frame in s.frames:
                    if frame.path in files and (frame.path, frame.line) not in seen:
                        seen.add((frame.path, frame.line))
                        code.append(
                            CodeLocation(frame.path, frame.line, frame.function, change.commit)
                        )
        if isinstance(change, Commit) and service:
            code = self.changed_lines(change, service, new)
        return Diagnosis(
            hypothesis=name,
            service=service,
            deploy=deploy,
            config_key=config_key,
            summary=self.summary(name, best, missing),
            confidence=self.confidence(best, missing),
            problem_type=self.problem_type(best, anomalies),
            related_services=related,
            code_locations=code,
            action=self.action(best),
            t0=t0,
            window=(self.start, self.end),
            anomalies=anomalies,
            new_signatures=new,
            candidates=candidates,
            findings=findings,
            missing=missing,
            commit=commit,
        )

    def changed_lines(
        self, commit: Commit, service: str, new: list[Signature]
    ) -> list[CodeLocation]:
        """Where a blamed commit changed the service's code: the frames of its new errors
        in the files it changed, else the first changed line of each of its hunks there."""
        cited: list[CodeLocation] = []
        for s in new:
            for frame in s.frames if s.service == service else ():
                where = CodeLocation(frame.path, frame.line, frame.function, commit.commit)
                if frame.path in commit.files and where not in cited:
                    cited.append(where)
        if cited:
            return cited
        folder = self.system.services[service].repo_dir.strip("/") + "/"
        return [
            CodeLocation(path, hunk.line, hunk.function, commit.commit)
            for path, hunks in commit.files.items()
            if path.startswith(folder)
            for hunk in hunks
        ][:MAX_CHANGED_LINES]

    def summary(self, name: str, best: Finding | None, missing: list[str]) -> dict[str, str]:
        text = self.rules.hypotheses[name].text if name in self.rules.hypotheses else {}
        change = best.change if best else None
        values = {
            "service": best.service if best else "",
            "change": change.id if change else "",
            "key": change.key if isinstance(change, ConfigChange) else "",
            "signature": best.signature.sample if best and best.signature else "",
            "missing": ", ".join(missing) or "-",
            # the files a blamed commit changed (a hypothesis' text may name them)
            "files": ", ".join(change.files) if isinstance(change, Commit) else "",
        }
        return {lang: template.format(**values) for lang, template in text.items()}

    def confidence(self, best: Finding | None, missing: list[str]) -> float:
        rules = self.rules.confidence
        if best is None:
            return 0.0
        score = rules.base + sum(rules.weights.get(c, 0.0) for c in set(best.conditions))
        score -= rules.missing_source * len(missing)
        return round(max(0.0, min(rules.max, score)), 2)

    def action(self, best: Finding | None) -> dict[str, Any] | None:
        if best is None:
            return None
        spec = self.rules.hypotheses[best.hypothesis].action
        if spec is None:
            return None
        tool, risk = spec.tool, spec.risk_class
        if self.system.kind(best.service) == "external" and tool not in self.rules.external_actions:
            # A third party is never restarted, rolled back or failed over by us.
            tool, risk = self.rules.external_actions[0], "R1"
        args: dict[str, Any] = {"service": best.service}
        if isinstance(best.change, Deploy) and tool == "rollback_deploy":
            args["deploy"] = best.change.id
        if isinstance(best.change, ConfigChange) and tool == "revert_config":
            args["key"] = best.change.key
        if isinstance(best.change, Commit) and tool == "rollback_deploy":
            args["commit"] = best.change.id
        return {"tool": tool, "args": args, "risk_class": risk}

    def problem_type(self, best: Finding | None, anomalies: list[Anomaly]) -> str:
        stated = self.bundle.incident.problem_type
        if stated in self.rules.problem_types:
            return stated
        if any(a.metric == "up" for a in anomalies):
            return "service_down"
        if best and best.hypothesis in ("disk_full", "db_pool_exhausted", "memory_leak"):
            return "resource_exhaustion"
        if any(a.metric == "latency_p99_ms" for a in anomalies) and not any(
            a.metric in ("http_error_ratio", "log_errors_per_minute") for a in anomalies
        ):
            return "slow_response"
        return "error_spike"


def _median(values: list[float]) -> float:
    return float(median(values)) if values else 0.0


def _first_run(breach: list[bool], length: int) -> int | None:
    run = 0
    for index, hit in enumerate(breach):
        run = run + 1 if hit else 0
        if run == length:
            return index - length + 1
    return None


def minutes_between(start: datetime, end: datetime) -> list[datetime]:
    first = start.replace(second=0, microsecond=0)
    count = int((end - first).total_seconds() // 60) + 1
    return [first + timedelta(minutes=i) for i in range(count)]


def _paired_at_least(
    used: list[tuple[datetime, float]], limit: list[tuple[datetime, float]], ratio: float
) -> bool:
    limits = dict(limit)
    return any(ts in limits and limits[ts] > 0 and v >= ratio * limits[ts] for ts, v in used)


def _names(text: str, word: str) -> bool:
    """Whether `text` names `word` as a word (service names hold dashes)."""
    word = word.lower()
    start = text.find(word)
    while start >= 0:
        before = text[start - 1] if start else " "
        after = text[start + len(word)] if start + len(word) < len(text) else " "
        if not (before.isalnum() or before in "-_") and not (after.isalnum() or after in "-_"):
            return True
        start = text.find(word, start + 1)
    return False


def _change_named(change: Deploy | ConfigChange, signature: Signature) -> bool:
    if isinstance(change, Deploy):
        files = set(change.files)
        return any(frame.path in files for frame in signature.frames)
    text = f" {signature.sample.lower()} "
    return _names(text, change.key) or (change.new is not None and _names(text, str(change.new)))
