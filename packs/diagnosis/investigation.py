"""The evidence a diagnosis reads, as calls every run mode makes the same way
(DIAGNOSIS.md §2, §4): which calls the bundle warrants, each call's result, whether it
added evidence, and the playbook's reading of what the calls read.

The calls' results are the tools' answers over the session's bundle (the playbook's
window and T0 mark what is new in them). The conclusion is the playbook's reading of the
sources whose calls succeeded: a source the agent did not read (its call failed, or a
degraded run left it out) counts as missing, as in a bundle without it. So every mode
that reads the same sources concludes the same, whatever order it read them in."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from diagnosis.agent.tools import ToolContext, run_recorded
from packs.diagnosis.bundle import Bundle, Commit, open_bundle
from packs.diagnosis.charts import downsample
from packs.diagnosis.code import CodeToolError
from packs.diagnosis.evidence import Evidence
from packs.diagnosis.knowledge import similar_cases_tool
from packs.diagnosis.playbook import diagnose, minutes_between
from packs.diagnosis.playbook_data import Diagnosis, Playbook
from packs.diagnosis.prometheus import MetricsSourceError
from packs.diagnosis.skill_calls import is_skill, run_skill_call, skill_calls
from packs.diagnosis.slow import read_code, read_commits, read_samples
from packs.diagnosis.sources import session_code, session_metrics
from packs.diagnosis.storage import bundle_dir
from packs.diagnosis.system import System
from packs.diagnosis.tool_args import LogSearchArgs, MetricQueryArgs, checked

# How many error signatures and anomalies a tool result keeps (the rest are counted).
MAX_LISTED = 20
# The source each reading tool reads (the playbook's sources).
SOURCE_OF = {
    "log_signatures": "logs",
    "anomalies": "metrics",
    "deploys": "deploys",
    "config_changes": "config_changes",
    "commits": "commits",
}
# Where a call stands in the evidence list, whichever mode made it (the page and the
# report list calls by position): the reads first, then what they led to.
ORDER = {
    "read_bundle": 1,
    "log_signatures": 2,
    "anomalies": 3,
    "deploys": 4,
    "config_changes": 5,
    "commits": 6,
}
FOLLOW_UPS = ("topology", "similar_cases", "code")


@dataclass(frozen=True)
class _Opened:
    bundle: Bundle
    whole: Diagnosis
    # Why the configured metrics source could not be read ("" when it was, or none is).
    metrics_error: str = ""
    # Why the system's repository could not be read ("" when it was, or is not read).
    commits_error: str = ""
    # What the repository was read over (the commits the playbook may blame).
    commits_window: dict[str, str] | None = None


# A job's steps read the same stored bundle again and again (a ReAct step per call, a
# specialist per branch): it is checked and read once per process and problem type.
# The stored copy never changes (packs.diagnosis.storage).
_OPENED: OrderedDict[tuple[str, str, str], _Opened] = OrderedDict()
_OPENED_LOCK = threading.Lock()
_KEPT = 8


class Investigation:
    """One session's bundle as the evidence calls see it, with the playbook's reading."""

    def __init__(self, session_id: Any, system: System, playbook: Playbook, problem_type: str):
        self.session_id, self.system, self.playbook = session_id, system, playbook
        key = (str(session_id), problem_type, playbook.model_dump_json())
        with _OPENED_LOCK:
            opened = _OPENED.get(key)
            if opened is not None:
                _OPENED.move_to_end(key)
        if opened is None:
            bundle = open_bundle(bundle_dir(session_id))
            if problem_type in playbook.problem_types:  # the reporter's choice on the form
                bundle.incident = bundle.incident.model_copy(update={"problem_type": problem_type})
            opened = _open_sources(session_id, bundle, system, playbook)
            with _OPENED_LOCK:
                _OPENED[key] = opened
                while len(_OPENED) > _KEPT:
                    _OPENED.popitem(last=False)
        self.bundle, self.whole = opened.bundle, opened.whole
        self.metrics_error = opened.metrics_error
        self.commits_error, self.commits_window = opened.commits_error, opened.commits_window
        since, until = self.whole.window
        self.window = {"since": since.isoformat(), "until": until.isoformat()}
        self._readings: dict[frozenset[str], Diagnosis] = {}

    # The calls ---------------------------------------------------------------------
    def base_calls(self) -> list[dict[str, Any]]:
        """The reads the bundle warrants, each of a source it holds."""
        calls = []
        if self.bundle.has_logs:
            calls.append(self._call("log_signatures", dict(self.window)))
        if self.bundle.has_metrics:
            calls.append(self._call("anomalies", dict(self.window)))
        if self.bundle.deploys:
            calls.append(self._call("deploys", dict(self.window)))
        if self.bundle.config_changes:
            calls.append(self._call("config_changes", dict(self.window)))
        if self.commits_window is not None:  # the system's repository, read by its server
            calls.append(self._call("commits", dict(self.commits_window)))
        return calls

    def follow_ups(self, found: Diagnosis) -> list[dict[str, Any]]:
        """What a reading leads to: each candidate's topology, the past cases like it,
        the code at each frame the blamed deploy changed."""
        calls = [
            {
                "call_id": f"ev-topology-{service}",
                "tool": "topology",
                "args": {"service": service},
                "position": 10 + index,
            }
            for index, service in enumerate(found.candidates)
        ]
        calls.append(
            {
                "call_id": "ev-similar_cases",
                "tool": "similar_cases",
                "args": self.similar_args(found),
                "position": 25,
            }
        )
        calls += [
            {
                "call_id": f"ev-code-{index}",
                "tool": "code",
                "args": {"commit": loc.commit, "path": loc.path, "line": loc.line},
                "position": 30 + index,
            }
            for index, loc in enumerate(found.code_locations, start=1)
        ]
        return calls + skill_calls(found, self.window)

    def similar_args(self, found: Diagnosis) -> dict[str, Any]:
        """The past cases are searched with the incident's words, what the new errors at
        or towards the suspects say, and the services in play (the suspects first)."""
        incident = self.bundle.incident
        suspects = found.candidates
        errors = dict.fromkeys(
            s.template
            for s in found.new_signatures
            if s.service in suspects or s.upstream in suspects
        )
        return {
            "text": "\n".join(
                t for t in (incident.title, incident.description, *list(errors)[:3]) if t
            ),
            "services": list(
                dict.fromkeys([*suspects, *incident.services, *found.related_services])
            ),
        }

    def _call(self, tool: str, args: dict[str, Any], prefix: str = "ev") -> dict[str, Any]:
        return {
            "call_id": f"{prefix}-{tool}",
            "tool": tool,
            "args": args,
            "position": ORDER[tool] + (40 if prefix != "ev" else 0),
        }

    def retry_call(self, tool: str) -> dict[str, Any]:
        """A read made again by the orchestrator on a degraded run's minimal path."""
        return self._call(tool, dict(self.window), prefix="ev-min")

    # The reading --------------------------------------------------------------------
    def unread(self, evidence: list[dict[str, Any]]) -> frozenset[str]:
        """The sources the bundle holds whose read did not succeed in `evidence`."""
        succeeded = {e["tool"] for e in evidence if not e.get("error")}
        return frozenset(
            SOURCE_OF[c["tool"]] for c in self.base_calls() if c["tool"] not in succeeded
        )

    def reading(self, evidence: list[dict[str, Any]]) -> Diagnosis:
        """The playbook's reading of the sources `evidence` read."""
        unread = self.unread(evidence)
        if not unread:
            return self.whole
        if unread not in self._readings:
            read = {name for name in self.bundle.sources if name not in unread}
            self._readings[unread] = diagnose(
                self.bundle.read_only(read), self.system, self.playbook
            )
        return self._readings[unread]

    def conclusion(self, evidence: list[dict[str, Any]]) -> dict[str, Any]:
        return _conclusion(self.reading(evidence), self.system)

    # Running a call -----------------------------------------------------------------
    def run(self, tctx: ToolContext, call: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The call, recorded (a re-run reuses its record): the evidence item it adds, and
        the tool's answer."""
        response, error = run_recorded(tctx, call, lambda: self._compute(call))
        tool = call["tool"]
        item = {
            "id": call["call_id"],
            "tool": tool,
            "summary": response.get("summary", "") if not error else f"failed: {error}",
            "error": error,
            "new": adds_evidence(tool, response, error),
        }
        return item, response

    def _compute(self, call: dict[str, Any]) -> dict[str, Any]:
        if is_skill(call["tool"]):  # its arguments are checked against its manifest's schema
            return run_skill_call(self.session_id, call)
        # a bad argument fails this call (recorded with the message), never the step
        tool, args = call["tool"], checked(call["tool"], call["args"])
        if tool == "anomalies" and self.metrics_error:
            raise MetricsSourceError(self.metrics_error)
        if tool == "commits":
            if self.commits_error:
                raise CodeToolError(self.commits_error)
            return _commits(self.bundle.commits or [], self.system, self.whole)
        if tool in ("log_signatures", "anomalies", "log_search", "metric_query"):
            source = Evidence(self.bundle)
            try:
                if tool == "log_signatures":
                    return _signatures(source, self.whole, (args.since, args.until))
                if tool == "anomalies":
                    return _anomalies(source, self.whole)
                if tool == "log_search":
                    return _log_search(source, args)
                return _metric_query(source, args)
            finally:
                source.close()
        if tool == "deploys":
            return _changes(self.bundle.deploys, "deploys", self.whole.window)
        if tool == "config_changes":
            return _changes(self.bundle.config_changes, "config changes", self.whole.window)
        if tool == "topology":
            return _topology(self.system, args.service)
        if tool == "similar_cases":
            return similar_cases_tool(self.session_id, args.model_dump())
        if tool == "code":
            return _code(self.session_id, self.bundle, _Location(args.commit, args.path, args.line))
        raise ValueError(f"not an evidence tool: {tool}")


def _open_sources(session_id: Any, bundle: Bundle, system: System, playbook: Playbook) -> _Opened:
    """The bundle with the session's live sources, each read once for the whole window:
    the samples of the configured Prometheus it was started with (else its file), and,
    on its system's sources without a deploy record, the recent commits of the system's
    repository through its git server. A source that fails is left unread: its call
    fails with the reason (recorded) and the reading goes on without it, listing it as
    missing (for commits: the changes)."""
    unread: set[str] = set()
    metrics_error = commits_error = ""
    try:
        name, source = session_metrics(session_id)
        if source is not None:
            fetched = read_samples(name, source, bundle, playbook)
            bundle = replace(bundle, has_metrics=True, metric_samples=fetched)
            bundle.metric_rows = len(fetched)
    except MetricsSourceError as exc:
        # The base calls still read metrics (the session was started with a source), so
        # the failed read is a call; what is concluded is read as if there were none.
        metrics_error = str(exc)
        bundle = replace(bundle, has_metrics=True, metric_samples=[])
        unread.add("metrics")
    attached = session_code(session_id)
    window: dict[str, str] | None = None
    if attached and not bundle.deploys:
        # No deploy record to blame: the repository's commits are the changes, read over
        # the window and the change window before it (a commit that may precede T0).
        start, until = bundle.incident.window_bounds(playbook.window_minutes)
        since = start - timedelta(minutes=playbook.change_window_minutes)
        window = {"since": since.isoformat(), "until": until.isoformat()}
        commits: list[Commit] = []
        try:
            commits = read_commits(attached, since, until)
        except CodeToolError as exc:
            commits_error = str(exc)
            unread.add("commits")
        bundle = replace(bundle, commits=commits)
    read = {n for n in bundle.sources if n not in unread}
    whole = diagnose(bundle.read_only(read) if unread else bundle, system, playbook)
    return _Opened(bundle, whole, metrics_error, commits_error, window)


@dataclass(frozen=True)
class _Location:
    commit: str
    path: str
    line: int


def adds_evidence(tool: str, response: dict[str, Any], error: str) -> bool:
    """Whether a call's answer added evidence: a failure or an empty answer did not."""
    if error:
        return False
    if tool == "log_signatures":
        return bool(response.get("new"))
    if tool == "anomalies":
        return bool(response.get("anomalies"))
    if tool in ("deploys", "config_changes", "commits"):  # one before the window explains nothing
        return bool(response.get("in_window"))
    if tool == "similar_cases":
        return bool(response.get("cases"))
    return True


def _signatures(
    source: Evidence, found: Diagnosis, window: tuple[datetime, datetime] | None = None
) -> dict[str, Any]:
    """The signatures over `window` (the call's: the playbook's, or the window a
    reporter gave the logs specialist)."""
    since, until = window or found.window
    every = source.log_signatures(since=since, until=until)
    new = {(s.service, s.template) for s in found.new_signatures}
    listed = [{**s.as_dict(), "new": (s.service, s.template) in new} for s in every[:MAX_LISTED]]
    newest = found.new_signatures[:3]
    words = "; ".join(f"{s.service} x{s.count} {s.sample[:80]}" for s in newest)
    return {
        "signatures": listed,
        "total": len(every),
        "new": len(new),
        "summary": f"{len(every)} error signatures, {len(new)} new"
        + (f": {words}" if words else ""),
    }


def _anomalies(source: Evidence, found: Diagnosis) -> dict[str, Any]:
    """Each anomaly with its series over the window (downsampled), for the page's chart:
    the picture comes from the log, as the rest of the evidence does."""
    since, until = found.window
    listed = found.anomalies[:MAX_LISTED]
    metrics = sorted({a.metric for a in listed if a.metric != "log_errors_per_minute"})
    samples = source.series(metrics, since=since, until=until) if metrics else {}
    quiet = sorted({a.service for a in listed if a.metric == "log_errors_per_minute"})
    per_minute = source.errors_per_minute(quiet, since, until)
    minutes = minutes_between(since, until)
    rows: list[dict[str, Any]] = []
    for a in found.anomalies:
        row: dict[str, Any] = {
            "service": a.service,
            "metric": a.metric,
            "onset": a.onset.isoformat(),
            "baseline": a.baseline,
            "peak": a.peak,
        }
        if len(rows) < MAX_LISTED:
            if a.metric == "log_errors_per_minute":
                counts = per_minute.get(a.service, {})
                series = [(m, float(counts.get(m, 0))) for m in minutes]
            else:
                series = samples.get((a.service, a.metric), [])
            row["series"] = downsample(series)
        rows.append(row)
    words = "; ".join(f"{a['service']} {a['metric']} from {a['onset']}" for a in rows[:3])
    return {
        "anomalies": rows[:MAX_LISTED],
        "t0": found.t0.isoformat(),
        "summary": f"{len(rows)} metric anomalies" + (f": {words}" if words else ""),
    }


def _log_search(source: Evidence, args: LogSearchArgs) -> dict[str, Any]:
    """Log lines as asked (oldest first), e.g. the sample lines of a new signature."""
    lines = source.log_search(
        service=args.service,
        level=args.level,
        contains=args.contains,
        since=args.since,
        until=args.until,
        limit=args.limit,
    )
    rows = [{**line, "ts": str(line["ts"])} for line in lines]
    where = " ".join(
        f"{name}={value}"
        for name, value in (("service", args.service), ("level", args.level))
        if value
    )
    return {
        "lines": rows,
        "summary": f"{len(rows)} log lines"
        + (f" ({where})" if where else "")
        + (f": {rows[0]['msg'][:80]}" if rows else ""),
    }


def _metric_query(source: Evidence, args: MetricQueryArgs) -> dict[str, Any]:
    """One metric's samples in time order (downsampled as the charts draw them)."""
    samples = source.metric_query(args.service, args.metric, since=args.since, until=args.until)
    values = [v for _, v in samples]
    return {
        "service": args.service,
        "metric": args.metric,
        "series": downsample(samples),
        "samples": len(samples),
        "summary": f"{args.service} {args.metric}: {len(samples)} samples"
        + (f", {min(values)} to {max(values)}" if values else ""),
    }


def _changes(changes: list[Any], what: str, window: tuple[datetime, datetime]) -> dict[str, Any]:
    rows = [c.model_dump(mode="json") for c in changes]
    words = "; ".join(
        f"{c['id']} {c['service']} {c.get('version') or c.get('key') or ''} at {c['at']}"
        for c in rows[:3]
    )
    since, until = window
    return {
        "changes": rows[:MAX_LISTED],
        "in_window": sum(1 for c in changes if since <= c.at <= until),
        "summary": f"{len(rows)} {what}: {words}",
    }


def _commits(commits: list[Commit], system: System, found: Diagnosis) -> dict[str, Any]:
    """The repository's commits as read (newest first): when, who, what, the files and
    the services whose code they changed; those inside the incident's window counted."""
    folders = {
        name: spec.repo_dir.strip("/") + "/"
        for name, spec in system.services.items()
        if spec.repo_dir
    }
    rows = [
        {
            "id": c.id,
            "commit": c.commit,
            "at": c.at.isoformat(),
            "author": c.author,
            "message": c.message[:200],
            "files": list(c.files),
            "services": sorted(
                {s for s, folder in folders.items() for path in c.files if path.startswith(folder)}
            ),
        }
        for c in commits
    ]
    since, until = found.window
    words = "; ".join(
        f"{r['id']} {','.join(r['services']) or '-'} at {r['at']}: {r['message'][:60]}"
        for r in rows[:3]
    )
    return {
        "commits": rows[:MAX_LISTED],
        "in_window": sum(1 for c in commits if since <= c.at <= until),
        "blamed": found.commit or "",
        "summary": f"{len(rows)} commits" + (f": {words}" if words else ""),
    }


def _topology(system: System, service: str) -> dict[str, Any]:
    found = system.topology(service)
    return {
        **found,
        "kind": system.kind(service),
        "summary": f"{service} ({system.kind(service)}): called by "
        f"{', '.join(found['callers']) or 'none'}; depends on "
        f"{', '.join(found['depends_on']) or 'none'}",
    }


def _code(session_id: Any, bundle: Bundle, location: Any) -> dict[str, Any]:
    """The code tool through MCP, a slow tool (a wait), retried per the tools' policy
    when its server crashed, hung or refused; after the last attempt the call fails
    (recorded) and the diagnosis goes on without it."""
    return read_code(session_id, bundle, location.commit, location.path, location.line)


def _conclusion(found: Diagnosis, system: System) -> dict[str, Any]:
    action = found.action
    return {
        "hypothesis": found.hypothesis,
        "service": found.service,
        "service_kind": system.kind(found.service) if found.service else "",
        "deploy": found.deploy,
        "commit": found.commit,
        "config_key": found.config_key,
        "summary": found.summary,
        "confidence": found.confidence,
        "problem_type": found.problem_type,
        "related_services": found.related_services,
        "code_locations": [asdict(c) for c in found.code_locations],
        "candidates": [
            {
                "hypothesis": f.hypothesis,
                "service": f.service,
                "rank": f.rank,
                "conditions": list(f.conditions),
            }
            for f in found.findings
        ],
        "missing": found.missing,
        "t0": found.t0.isoformat(),
        "window": [found.window[0].isoformat(), found.window[1].isoformat()],
        "action": action,
    }
