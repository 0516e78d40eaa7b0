"""Metrics from a live Prometheus instead of the bundle's metrics.csv (issue 36 item 2).

Samples are read through `/api/v1/query_range`, one metric at a time: its values and
`timestamp()` of the same selector, so each step says which sample it saw. Keeping each
sample once by that timestamp gives the raw samples (as in metrics.csv), not the steps'
look-back repeats, so the playbook finds the same anomalies, onsets and states. The step
must not be longer than the scrape interval (a sample between two steps would be lost).

Any failure (not reachable, no answer within the source's timeout, an HTTP or PromQL
error, an answer that is not Prometheus's) raises `MetricsSourceError` with the reason
in words; the caller records the failed call and reads on without metrics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

# Prometheus refuses a range query of more than 11,000 points a series.
MAX_POINTS = 10_000


class MetricsSourceError(RuntimeError):
    """A metrics source failed to answer; the message says why."""


@dataclass(frozen=True)
class PrometheusSource:
    """Where and how to read: the base URL (no /api/v1), a timeout per request in
    seconds, the query step in seconds, and optional basic auth or a bearer token."""

    base_url: str
    timeout: float = 5.0
    step: float = 15.0
    username: str = ""
    password: str = ""
    bearer_token: str = ""
    # The label naming a sample's service (the bundle's `service` column).
    service_label: str = "service"

    def client(self) -> httpx.Client:
        headers = {"Accept": "application/json"}
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        auth = httpx.BasicAuth(self.username, self.password) if self.username else None
        return httpx.Client(
            base_url=self.base_url.rstrip("/"),
            headers=headers,
            auth=auth,
            timeout=httpx.Timeout(self.timeout),
            follow_redirects=False,
        )


Sample = tuple[datetime, str, str, float]  # (ts, service, metric, value): a metrics.csv row


def _selector(metric: str, label: str) -> str:
    return f'{metric}{{{label}!=""}}'


def _get(client: httpx.Client, source: PrometheusSource, path: str, params: dict[str, Any]) -> Any:
    """One API request's `data`, or MetricsSourceError saying what went wrong."""
    where = f"Prometheus at {source.base_url}"
    try:
        response = client.get(path, params=params)
    except httpx.TimeoutException:
        raise MetricsSourceError(f"{where} did not answer within {source.timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise MetricsSourceError(f"{where} cannot be reached: {exc}") from None
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise MetricsSourceError(
            f"{where} answered HTTP {response.status_code} with no Prometheus JSON: "
            f"{response.text[:200]!r}"
        )
    if response.status_code != 200 or body.get("status") != "success":
        error = body.get("error") or body.get("errorType") or "no reason given"
        raise MetricsSourceError(f"{where} answered HTTP {response.status_code}: {error}")
    return body.get("data")


def _matrix(data: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise MetricsSourceError(f"{where} did not answer a range query with a matrix")
    result = data.get("result")
    if not isinstance(result, list):
        raise MetricsSourceError(f"{where} answered a matrix without a result list")
    return result


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def samples(
    source: PrometheusSource, metrics: list[str], since: datetime, until: datetime
) -> list[Sample]:
    """Every sample of `metrics` with a service label between `since` and `until`, as
    metrics.csv rows, in (service, metric, ts) order."""
    span = (until - since).total_seconds()
    step = max(source.step, math.ceil(span / MAX_POINTS))
    # One step past `until`: a sample after the last step point is seen by the next one.
    params = {
        "start": f"{since.timestamp():.3f}",
        "end": f"{(until + timedelta(seconds=step)).timestamp():.3f}",
        "step": f"{step:g}",
    }
    where = f"Prometheus at {source.base_url}"
    rows: list[Sample] = []
    with source.client() as client:
        for metric in metrics:
            selector = _selector(metric, source.service_label)
            values = _matrix(
                _get(client, source, "/api/v1/query_range", {**params, "query": selector}), where
            )
            stamps = _matrix(
                _get(
                    client,
                    source,
                    "/api/v1/query_range",
                    {**params, "query": f"timestamp({selector})"},
                ),
                where,
            )
            # Per series, per step: the time of the sample that step saw.
            seen_at = {
                _key(s.get("metric") or {}): {at: stamp for at, stamp in s.get("values") or []}
                for s in stamps
            }
            for series in values:
                labels = series.get("metric") or {}
                service = labels.get(source.service_label)
                if not service:
                    continue
                stamp_at = seen_at.get(_key(labels), {})
                kept: dict[float, float] = {}
                for at, value in series.get("values") or []:
                    if at in stamp_at:
                        kept[float(stamp_at[at])] = float(value)
                for stamp, value in kept.items():
                    ts = datetime.fromtimestamp(stamp, tz=UTC)
                    if since <= ts <= until:
                        rows.append((ts, service, metric, value))
    rows.sort(key=lambda r: (r[1], r[2], r[0]))
    return rows


def check(source: PrometheusSource) -> str:
    """A test connection: Prometheus's build info, in words; MetricsSourceError if not."""
    with source.client() as client:
        data = _get(client, source, "/api/v1/status/buildinfo", {})
        _get(client, source, "/api/v1/query", {"query": "1"})  # queries are allowed too
    version = data.get("version", "?") if isinstance(data, dict) else "?"
    return f"Prometheus {version} at {source.base_url} answers queries"
