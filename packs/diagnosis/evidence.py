"""Evidence over a bundle's files, queried with DuckDB (nothing is loaded whole into
Python): log search and error signatures, metric series, deploys and config changes.
These are the embedded adapters of the pack's evidence tools."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import duckdb

from packs.diagnosis.bundle import Bundle, ConfigChange, Deploy, _quote

LOG_COLUMNS = (
    "{ts: 'TIMESTAMPTZ', service: 'VARCHAR', level: 'VARCHAR', msg: 'VARCHAR', "
    "trace_id: 'VARCHAR', error: 'VARCHAR', stack: 'VARCHAR[]', upstream: 'VARCHAR'}"
)
# An error message as a template: ids (UUIDs, hex of 8+ digits, 0x...) and numbers
# replaced, so "timeout after 3012ms" and "timeout after 2998ms" are one signature.
TEMPLATE_SQL = (
    "regexp_replace(regexp_replace(regexp_replace(msg, "
    r"'[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
    r"|\b0x[0-9a-fA-F]+\b|\b[0-9a-fA-F]{8,}\b', '<id>', 'g'), "
    r"'[0-9]+', '<n>', 'g'), '<n>(\.<n>)+', '<n>', 'g')"
)


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str

    @classmethod
    def parse(cls, text: str) -> Frame | None:
        where, _, function = text.partition(" in ")
        path, _, line = where.rpartition(":")
        if not path or not line.isdigit():
            return None
        return cls(path=path, line=int(line), function=function.strip())


@dataclass(frozen=True)
class Signature:
    service: str
    template: str
    count: int
    first_seen: datetime
    last_seen: datetime
    sample: str
    upstream: str | None
    error: str | None
    stack: tuple[str, ...] = ()

    @property
    def frames(self) -> list[Frame]:
        return [f for f in (Frame.parse(s) for s in self.stack) if f is not None]

    def as_dict(self) -> dict[str, Any]:
        return {
            "service": self.service,
            "template": self.template,
            "count": self.count,
            "first_seen": self.first_seen.isoformat(),
            "last_seen": self.last_seen.isoformat(),
            "sample": self.sample,
            "upstream": self.upstream,
            "error": self.error,
            "stack": list(self.stack),
        }


@dataclass
class Evidence:
    """One DuckDB connection over one bundle; `close` when done."""

    bundle: Bundle
    con: duckdb.DuckDBPyConnection = field(init=False)
    _log_services: set[str] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.con = duckdb.connect()
        if self.bundle.has_logs:
            self.con.execute(
                f"CREATE VIEW logs AS SELECT * FROM read_json({_quote(self.bundle.logs_path)}, "
                f"format='newline_delimited', columns={LOG_COLUMNS})"
            )
            # The playbook reads ERROR records many times: parse them out of the file once
            # (DuckDB's memory, columnar; a million-line file has a few thousand).
            self.con.execute("CREATE TABLE errors AS SELECT * FROM logs WHERE level = 'ERROR'")
        samples = self.bundle.metric_samples
        if self.bundle.has_metrics and samples is not None:
            # A configured source's samples: one statement, columns as lists.
            self.con.execute(
                "CREATE TABLE metrics (ts TIMESTAMPTZ, service VARCHAR, metric VARCHAR, "
                "value DOUBLE)"
            )
            if samples:
                self.con.execute(
                    "INSERT INTO metrics SELECT unnest(?), unnest(?), unnest(?), unnest(?)",
                    [list(column) for column in zip(*samples, strict=True)],
                )
        elif self.bundle.has_metrics:
            columns = "{'ts': 'TIMESTAMPTZ', 'service': 'VARCHAR', 'metric': 'VARCHAR', "
            columns += "'value': 'DOUBLE'}"
            self.con.execute(
                "CREATE TABLE metrics AS SELECT * FROM "
                f"read_csv({_quote(self.bundle.metrics_path)}, header=true, auto_detect=false, "
                f"columns={columns})"
            )

    def close(self) -> None:
        self.con.close()

    # Logs -------------------------------------------------------------------------
    def log_search(
        self,
        *,
        service: str | None = None,
        level: str | None = None,
        contains: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        if not self.bundle.has_logs:
            return []
        where, params = _filters(service=service, since=since, until=until)
        if level:
            where.append("level = ?")
            params.append(level)
        if contains:
            where.append("contains(lower(msg), lower(?))")
            params.append(contains)
        rows = self.con.execute(
            "SELECT ts, service, level, msg, upstream, error, stack FROM logs "
            f"WHERE {' AND '.join(where) or 'true'} ORDER BY ts LIMIT ?",
            [*params, max(1, min(limit, 1000))],
        ).fetchall()
        keys = ("ts", "service", "level", "msg", "upstream", "error", "stack")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def log_signatures(
        self,
        *,
        service: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[Signature]:
        """ERROR signatures with counts, first and last seen, a sample, upstream, stack."""
        if not self.bundle.has_logs:
            return []
        where, params = _filters(service=service, since=since, until=until)
        rows = self.con.execute(
            f"""
            SELECT service, {TEMPLATE_SQL} AS template, count(*), min(ts), max(ts),
                   arg_min(msg, ts), any_value(upstream) FILTER (WHERE upstream IS NOT NULL),
                   any_value(error) FILTER (WHERE error IS NOT NULL),
                   arg_min(stack, ts) FILTER (WHERE stack IS NOT NULL)
            FROM errors WHERE {" AND ".join(where) or "true"}
            GROUP BY service, template ORDER BY min(ts), service, template
            """,
            params,
        ).fetchall()
        return [
            Signature(
                service=r[0],
                template=r[1],
                count=int(r[2]),
                first_seen=r[3],
                last_seen=r[4],
                sample=r[5],
                upstream=r[6],
                error=r[7],
                stack=tuple(r[8] or ()),
            )
            for r in rows
        ]

    def errors_per_minute(
        self, services: list[str], since: datetime, until: datetime
    ) -> dict[str, dict[datetime, int]]:
        if not self.bundle.has_logs or not services:
            return {}
        rows = self.con.execute(
            "SELECT service, date_trunc('minute', ts) AS minute, count(*) FROM errors "
            "WHERE service IN (SELECT unnest(?)) AND ts >= ? AND ts <= ? "
            "GROUP BY ALL",
            [services, since, until],
        ).fetchall()
        out: dict[str, dict[datetime, int]] = {}
        for service, minute, count in rows:
            out.setdefault(service, {})[minute] = int(count)
        return out

    def log_services(self) -> set[str]:
        if not self.bundle.has_logs:
            return set()
        if self._log_services is None:
            rows = self.con.execute("SELECT DISTINCT service FROM logs").fetchall()
            self._log_services = {r[0] for r in rows}
        return self._log_services

    # Metrics ----------------------------------------------------------------------
    def metric_query(
        self,
        service: str,
        metric: str,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[tuple[datetime, float]]:
        return self.series([metric], since=since, until=until, services=[service]).get(
            (service, metric), []
        )

    def series(
        self,
        metrics: list[str],
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        services: list[str] | None = None,
    ) -> dict[tuple[str, str], list[tuple[datetime, float]]]:
        """The samples of these metrics, per (service, metric), in time order."""
        if not self.bundle.has_metrics:
            return {}
        where, params = _filters(service=None, since=since, until=until)
        where.append("metric IN (SELECT unnest(?))")
        params.append(metrics)
        if services is not None:
            where.append("service IN (SELECT unnest(?))")
            params.append(services)
        rows = self.con.execute(
            f"SELECT service, metric, ts, value FROM metrics WHERE {' AND '.join(where)} "
            "ORDER BY service, metric, ts",
            params,
        ).fetchall()
        out: dict[tuple[str, str], list[tuple[datetime, float]]] = {}
        for service, metric, ts, value in rows:
            out.setdefault((service, metric), []).append((ts, float(value)))
        return out

    def metric_services(self) -> set[str]:
        if not self.bundle.has_metrics:
            return set()
        return {r[0] for r in self.con.execute("SELECT DISTINCT service FROM metrics").fetchall()}

    # Changes ----------------------------------------------------------------------
    def deploys(
        self,
        *,
        service: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[Deploy]:
        return [d for d in self.bundle.deploys if _within(d.service, d.at, service, since, until)]

    def config_changes(
        self,
        *,
        service: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[ConfigChange]:
        return [
            c for c in self.bundle.config_changes if _within(c.service, c.at, service, since, until)
        ]


def _filters(
    *, service: str | None, since: datetime | None, until: datetime | None
) -> tuple[list[str], list[Any]]:
    where: list[str] = []
    params: list[Any] = []
    if service:
        where.append("service = ?")
        params.append(service)
    if since is not None:
        where.append("ts >= ?")
        params.append(since)
    if until is not None:
        where.append("ts <= ?")
        params.append(until)
    return where, params


def _within(
    of: str, at: datetime, service: str | None, since: datetime | None, until: datetime | None
) -> bool:
    return (
        (service is None or of == service)
        and (since is None or at >= since)
        and (until is None or at <= until)
    )
