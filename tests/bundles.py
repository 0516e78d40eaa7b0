"""A small incident-bundle writer for the diagnosis tests: a quiet demo shop for two hours,
then whatever a test injects (an outage, a deploy, a noisy distractor)."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import yaml

TZ = timezone(timedelta(hours=8))
REPORTED = datetime(2026, 10, 20, 12, 0, tzinfo=TZ)
START = REPORTED - timedelta(minutes=120)
ONSET = REPORTED - timedelta(minutes=30)  # T0 of the injected incidents
SERVICES = ("gateway", "orders", "payments", "inventory", "cache", "orders-db", "inventory-db")
BASE = {
    "http_requests_per_s": 50.0,
    "http_error_ratio": 0.01,
    "latency_p99_ms": 120.0,
    "up": 1.0,
    "disk_used_ratio": 0.4,
    "db_connections_in_use": 10.0,
    "db_connections_max": 100.0,
    "memory_rss_mb": 300.0,
    "memory_limit_mb": 1024.0,
    "restarts_total": 0.0,
    "tls_cert_days_left": 90.0,
}


def iso(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds")


@dataclass
class BundleWriter:
    description: str = "下单失败，页面报错。"
    services_guess: list[str] = field(default_factory=list)
    problem_type: str = ""
    metrics: bool = True
    # (service, metric) -> value from ONSET on
    after: dict[tuple[str, str], float] = field(default_factory=dict)
    logs: list[dict[str, Any]] = field(default_factory=list)
    deploys: list[dict[str, Any]] = field(default_factory=list)
    config_changes: list[dict[str, Any]] = field(default_factory=list)
    repo_files: dict[str, str] = field(default_factory=dict)

    def errors(
        self,
        service: str,
        msg: str,
        *,
        count: int = 30,
        first: datetime = ONSET,
        every_s: int = 40,
        **extra: Any,
    ) -> None:
        for i in range(count):
            at = first + timedelta(seconds=i * every_s + 1)
            self.logs.append(
                {
                    "ts": iso(at),
                    "service": service,
                    "level": "ERROR",
                    "msg": msg.format(n=1000 + i),
                    **extra,
                }
            )

    def write(self, root: Path) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        incident: dict[str, Any] = {
            "id": "INC-T",
            "title": "test incident",
            "description": self.description,
            "reported_at": iso(REPORTED),
        }
        if self.problem_type:
            incident["problem_type"] = self.problem_type
        if self.services_guess:
            incident["services"] = self.services_guess
        (root / "incident.yaml").write_text(yaml.safe_dump(incident, allow_unicode=True), "utf-8")
        info = [
            {
                "ts": iso(START + timedelta(seconds=17 * i)),
                "service": SERVICES[i % 3],
                "level": "INFO",
                "msg": f"GET /ok 200 in {i % 40}ms",
            }
            for i in range(400)
        ]
        lines = sorted(info + self.logs, key=lambda r: r["ts"])
        (root / "logs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), "utf-8")
        if self.metrics:
            rows = ["ts,service,metric,value"]
            at = START
            while at <= REPORTED:
                for service in SERVICES:
                    for metric, value in BASE.items():
                        if at >= ONSET and (service, metric) in self.after:
                            value = self.after[(service, metric)]
                            if metric == "restarts_total":
                                value += (at - ONSET).total_seconds() // 600
                        rows.append(f"{iso(at)},{service},{metric},{value}")
                at += timedelta(minutes=1)
            (root / "metrics.csv").write_text("\n".join(rows) + "\n", "utf-8")
        if self.repo_files:
            self._repo(root / "repo")
        if self.deploys:
            (root / "deploys.yaml").write_text(yaml.safe_dump(self.deploys), "utf-8")
        if self.config_changes:
            (root / "config_changes.yaml").write_text(yaml.safe_dump(self.config_changes), "utf-8")
        return root

    def _repo(self, repo: Path) -> None:
        repo.mkdir()
        git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
        subprocess.run([*git, "init", "-q"], check=True)
        for path, text in self.repo_files.items():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text(text, "utf-8")
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "change"], check=True)
        head = subprocess.run(
            [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        )
        for deploy in self.deploys:
            if deploy.get("commit") == "HEAD":
                deploy["commit"] = head.stdout.strip()


def deploy(
    id: str, service: str, at: datetime, files: list[str], commit: str = ""
) -> dict[str, Any]:
    return {
        "id": id,
        "service": service,
        "version": "1.2.3",
        "at": iso(at),
        "author": "dev",
        "commit": commit,
        "files": files,
        "description": "a release",
    }


def config_change(
    id: str, service: str, key: str, old: Any, new: Any, at: datetime
) -> dict[str, Any]:
    return {
        "id": id,
        "service": service,
        "key": key,
        "old": old,
        "new": new,
        "at": iso(at),
        "author": "ops",
    }
