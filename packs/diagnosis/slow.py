"""The pack's slow tools (diagnosis.agent.slow_tools): reading a configured metrics
source, the code tool's MCP exchange and the recent commits of a system's repository,
declared once each. A node calls them through
`call_slow`; with waits on, the job ends at the call and the LLM runner makes it. Their
arguments name a configuration (a metrics source, the session whose bundle holds the
repository's path), never a secret: the tool reads it when it runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_incrementing

from diagnosis.agent.slow_tools import SlowToolFailed, call_slow, register_slow_tool
from packs.diagnosis import prometheus
from packs.diagnosis.bundle import Bundle, Commit
from packs.diagnosis.code import SERVER_NAME, CodeToolError, code, code_server, recent_commits
from packs.diagnosis.models import MetricsSource
from packs.diagnosis.playbook import metrics_window
from packs.diagnosis.playbook_data import READ_METRICS, Playbook
from packs.diagnosis.prometheus import MetricsSourceError, PrometheusSource, Sample
from packs.diagnosis.sources import session_code

METRICS_READ = "metrics_read"
CODE_READ = "code_read"
COMMITS_READ = "commits_read"
# Beyond the sum of its requests' timeouts: the runner's own margin for a call.
SLACK_SECONDS = 5.0
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MILLISECOND = timedelta(milliseconds=1)  # Prometheus's resolution


# --- metrics ----------------------------------------------------------------------------


def read_samples(
    name: str, source: PrometheusSource, bundle: Bundle, playbook: Playbook | None
) -> list[Sample]:
    """The playbook's metrics for `bundle` from the configured source `name`, as a slow
    tool (a wait); MetricsSourceError with the reason when it failed or timed out."""
    since, until = metrics_window(bundle, playbook)
    args = {
        "source": name,
        "metrics": list(READ_METRICS),
        "since": since.isoformat(),
        "until": until.isoformat(),
        "timeout": source.timeout,
    }
    try:
        result = call_slow(METRICS_READ, args)
    except SlowToolFailed as exc:
        raise MetricsSourceError(str(exc)) from None
    return samples_of(result)


def samples_result(rows: list[Sample]) -> dict[str, Any]:
    """A metrics read's answer as stored: each series once, (service, metric, its times in
    epoch milliseconds, its values). A row per sample repeating its service, metric and
    an ISO time was three times the size, and the runner's write of 100 such answers at
    once (encoding, then PostgreSQL parsing them as jsonb) was most of their wave."""
    series: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
    for ts, service, metric, value in rows:
        times, values = series.setdefault((service, metric), ([], []))
        times.append((ts - EPOCH) // MILLISECOND)
        values.append(value)
    return {"series": [[s, m, times, values] for (s, m), (times, values) in series.items()]}


def samples_of(result: dict[str, Any]) -> list[Sample]:
    """The samples of a stored answer (UTC, as Prometheus gives them), in the order
    prometheus.samples sorts them; an answer stored as rows (before) is read too."""
    if "samples" in result:
        return [
            (datetime.fromisoformat(ts), service, metric, float(value))
            for ts, service, metric, value in result["samples"]
        ]
    rows = [
        (EPOCH + ms * MILLISECOND, service, metric, float(value))
        for service, metric, times, values in result["series"]
        for ms, value in zip(times, values, strict=True)
    ]
    rows.sort(key=lambda r: (r[1], r[2], r[0]))
    return rows


def _metrics_read(args: dict[str, Any]) -> dict[str, Any]:
    row = MetricsSource.objects.filter(name=args["source"], enabled=True).first()
    if row is None:
        raise MetricsSourceError(
            f"the metrics source {args['source']} is no longer configured or enabled"
        )
    try:
        source = row.source()
    except ValueError as exc:
        raise MetricsSourceError(f"the metrics source {row.name}'s credential: {exc}") from None
    rows = prometheus.samples(
        source,
        list(args["metrics"]),
        datetime.fromisoformat(args["since"]),
        datetime.fromisoformat(args["until"]),
    )
    return samples_result(rows)


def _metrics_timeout(args: dict[str, Any]) -> float:
    # Two range queries per metric, each within the source's own timeout.
    return float(args["timeout"]) * 2 * len(args["metrics"]) + SLACK_SECONDS


# --- code -------------------------------------------------------------------------------


def read_code(session_id: Any, bundle: Bundle, commit: str, path: str, line: int) -> dict[str, Any]:
    """The code tool's answer for `path:line` at `commit`, as a slow tool (a wait): from
    the session's system's git server and repository when it was started on them, else
    the bundle's repo/. CodeToolError with the reason when its server failed every
    attempt or timed out."""
    attached = session_code(session_id)
    if attached:
        repo, server = Path(attached["repo"]), attached["server"]
    elif bundle.has_repo:
        repo, server = bundle.root / "repo", SERVER_NAME
    else:
        raise CodeToolError("the bundle has no repo/")
    # The configured server's own limit per exchange (or the built-in one's).
    per_exchange = code_server(repo, server).timeout
    args = {
        # A path on this host (the bundle's stored copy, or the system's repository),
        # as the worker's.
        "repo": str(repo),
        "server": server,
        "commit": commit,
        "path": path,
        "line": line,
        "timeout": per_exchange,
    }
    try:
        return call_slow(CODE_READ, args)
    except SlowToolFailed as exc:
        raise CodeToolError(str(exc)) from None


def _code_read(args: dict[str, Any]) -> dict[str, Any]:
    """Through MCP, retried per the tools' policy (AERO_TOOL_RETRIES, linear
    AERO_TOOL_BACKOFF) when its server crashed, hung or refused."""
    repo, name = Path(args["repo"]), args.get("server") or SERVER_NAME
    looked = _retrying()(
        lambda: code(
            repo,
            commit=args["commit"],
            path=args["path"],
            line=args["line"],
            # A system's own server by name; else the "git" one (or the built-in).
            server=code_server(repo, name) if name != SERVER_NAME else None,
        )
    )
    return {
        "commit": looked.commit,
        "path": looked.path,
        "line": looked.line,
        "hunk": looked.hunk,
        "excerpt": [[n, text] for n, text in looked.excerpt],
        "summary": f"{looked.path}:{looked.line} changed by {looked.commit[:10]}",
    }


def read_commits(attached: dict[str, str], since: datetime, until: datetime) -> list[Commit]:
    """The commits of the system's repository between `since` and `until` with the lines
    each changed, through its git server, as a slow tool (a wait): `attached` is the
    session's code source ({"server", "repo"}). CodeToolError with the reason when the
    server failed every attempt or timed out."""
    repo, server = Path(attached["repo"]), attached["server"]
    args = {
        "repo": str(repo),
        "server": server,
        "since": since.isoformat(),
        "until": until.isoformat(),
        # two exchanges (the log, then the commits), each within the server's limit
        "timeout": 2 * code_server(repo, server).timeout,
    }
    try:
        result = call_slow(COMMITS_READ, args)
    except SlowToolFailed as exc:
        raise CodeToolError(str(exc)) from None
    return [Commit.model_validate(c) for c in result["commits"]]


def _commits_read(args: dict[str, Any]) -> dict[str, Any]:
    """Through MCP, retried per the tools' policy as the code read is."""
    repo, name = Path(args["repo"]), args.get("server") or SERVER_NAME
    commits = _retrying()(
        lambda: recent_commits(
            repo,
            since=datetime.fromisoformat(args["since"]),
            until=datetime.fromisoformat(args["until"]),
            server=code_server(repo, name) if name != SERVER_NAME else None,
        )
    )
    return {"commits": [c.model_dump(mode="json") for c in commits]}


def _retrying() -> Retrying:
    return Retrying(
        retry=retry_if_exception_type(CodeToolError),
        stop=stop_after_attempt(settings.AERO_TOOL_RETRIES + 1),
        wait=wait_incrementing(
            start=settings.AERO_TOOL_BACKOFF, increment=settings.AERO_TOOL_BACKOFF
        ),
        reraise=True,
    )


def _code_timeout(args: dict[str, Any]) -> float:
    attempts = settings.AERO_TOOL_RETRIES + 1
    backoff = settings.AERO_TOOL_BACKOFF * sum(range(1, attempts))
    return float(args["timeout"]) * attempts + backoff + SLACK_SECONDS


def register() -> None:
    register_slow_tool(METRICS_READ, _metrics_read, _metrics_timeout)
    register_slow_tool(CODE_READ, _code_read, _code_timeout)
    register_slow_tool(COMMITS_READ, _commits_read, _code_timeout)
