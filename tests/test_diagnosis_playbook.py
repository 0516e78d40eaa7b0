"""The IT diagnosis pack's offline playbook: the shipped example bundles give exactly their
expected results, and every hypothesis is found in a bundle of its own with distractors
(an old error signature, an unrelated deploy or config change, the reporter's wrong guess
of the service, a bundle with logs only)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from packs.diagnosis.bundle import opened
from packs.diagnosis.playbook import diagnose
from packs.diagnosis.playbook_data import Diagnosis
from packs.diagnosis.system import demo_shop
from tests.bundles import ONSET, START, BundleWriter, config_change, deploy

# The example incidents the pack ships (copies of the spec's bundles and expected results).
SPEC = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
EXPECTED = yaml.safe_load((SPEC / "expected.yaml").read_text("utf-8"))


def run(writer: BundleWriter, tmp_path: Path) -> Diagnosis:
    with opened(writer.write(tmp_path / "bundle")) as bundle:
        return diagnose(bundle, demo_shop())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_shipped_example_bundles_give_their_expected_results(name: str) -> None:
    expected = EXPECTED[name]
    with opened(SPEC / f"{name}.tar.gz") as bundle:
        found = diagnose(bundle, demo_shop())
    assert (found.hypothesis, found.service) == (expected["hypothesis"], expected["service"])
    assert found.deploy == expected.get("deploy")
    if "code_path" in expected:
        assert (found.code_locations[0].path, found.code_locations[0].line) == (
            expected["code_path"],
            expected["code_line"],
        )
    action = expected["action"]
    assert found.action == {
        "tool": action["tool"],
        "args": {
            "service": action["service"],
            **({"deploy": found.deploy} if found.deploy else {}),
        },
        "risk_class": action["risk_class"],
    }
    assert 0 < found.confidence <= 1


def noisy(writer: BundleWriter) -> BundleWriter:
    """Distractors every case carries: an old signature that keeps going (noise, not
    new), the reporter's wrong guess of the service, and an unrelated gateway change."""
    writer.errors("gateway", "client closed request before response ({n})", first=START, count=150)
    writer.services_guess = ["gateway"]
    writer.config_changes.append(
        config_change("C-1", "gateway", "LOG_LEVEL", "INFO", "WARN", ONSET - timedelta(minutes=20))
    )
    return writer


def test_db_primary_down(tmp_path: Path) -> None:
    w = noisy(BundleWriter(after={("orders-db", "up"): 0, ("orders", "http_error_ratio"): 0.6}))
    # No upstream field: the message names orders' dependency.
    w.errors("orders", "connection refused by orders-db on attempt {n}")
    found = run(w, tmp_path)
    assert (found.hypothesis, found.service) == ("db_primary_down", "orders-db")
    assert found.action == {
        "tool": "failover_database",
        "args": {"service": "orders-db"},
        "risk_class": "R3",
    }
    assert found.related_services == ["orders", "orders-db"]


def test_cert_expired(tmp_path: Path) -> None:
    w = noisy(
        BundleWriter(
            after={("payments", "tls_cert_days_left"): 0, ("orders", "http_error_ratio"): 0.4}
        )
    )
    w.errors("orders", "x509: certificate has expired calling payments ({n})", upstream="payments")
    # An unrelated deploy of another service, before T0.
    w.deploys.append(
        deploy("D-9", "inventory", ONSET - timedelta(minutes=30), ["inventory/app/x.py"])
    )
    found = run(w, tmp_path)
    assert (found.hypothesis, found.service, found.deploy) == ("cert_expired", "payments", None)
    assert found.action == {
        "tool": "renew_certificate",
        "args": {"service": "payments"},
        "risk_class": "R2",
    }


def test_disk_full(tmp_path: Path) -> None:
    w = noisy(
        BundleWriter(
            after={("inventory", "disk_used_ratio"): 0.97, ("inventory", "http_error_ratio"): 0.3}
        )
    )
    w.errors("inventory", "write failed: No space left on device ({n} bytes)")
    found = run(w, tmp_path)
    assert (found.hypothesis, found.service) == ("disk_full", "inventory")
    assert found.action == {
        "tool": "free_disk_space",
        "args": {"service": "inventory"},
        "risk_class": "R2",
    }


def test_db_pool_exhausted(tmp_path: Path) -> None:
    w = noisy(
        BundleWriter(
            problem_type="slow_response",
            after={
                ("inventory", "db_connections_in_use"): 100,
                ("inventory", "latency_p99_ms"): 4000,
                ("orders", "latency_p99_ms"): 5000,
            },
        )
    )
    w.errors("inventory", "could not obtain a connection from the pool within 3.0s (in use {n})")
    w.errors("orders", "timeout calling inventory after {n}ms", upstream="inventory")
    found = run(w, tmp_path)
    assert (found.hypothesis, found.service) == ("db_pool_exhausted", "inventory")
    assert found.related_services == ["inventory", "orders"]
    assert found.problem_type == "slow_response"


def test_memory_leak(tmp_path: Path) -> None:
    w = noisy(
        BundleWriter(
            after={
                ("orders", "memory_rss_mb"): 1000,
                ("orders", "restarts_total"): 1,
                ("orders", "http_error_ratio"): 0.2,
            }
        )
    )
    w.errors("orders", "worker {n} was OOM-killed")
    found = run(w, tmp_path)
    assert (found.hypothesis, found.service) == ("memory_leak", "orders")
    assert found.action == {
        "tool": "restart_service",
        "args": {"service": "orders"},
        "risk_class": "R2",
    }
    assert found.problem_type == "resource_exhaustion"


def bad_deploy_writer(*, metrics: bool = True) -> BundleWriter:
    w = noisy(BundleWriter(metrics=metrics, after={("payments", "http_error_ratio"): 0.5}))
    # An old signature of the same service, seen since long before T0: noise.
    w.errors("payments", "cache miss for merchant {n}", first=START, count=150)
    # Logs only: the error rate itself must show the anomaly (>= 5 a minute).
    every_s, count = (40, 30) if metrics else (6, 200)
    w.errors(
        "payments",
        "ValueError: invalid signature for charge {n}",
        count=count,
        every_s=every_s,
        stack=[
            "payments/app/handlers.py:26 in verify_callback",
            "framework/dispatch.py:212 in handle",
        ],
    )
    w.repo_files = {"payments/app/handlers.py": "def verify_callback():\n    ...\n"}
    w.deploys += [
        deploy(
            "D-1",
            "payments",
            ONSET - timedelta(minutes=10),
            ["payments/app/handlers.py"],
            commit="HEAD",
        ),
        deploy("D-2", "gateway", ONSET - timedelta(minutes=5), ["gateway/app/routes.py"]),
    ]
    return w


def test_bad_deploy_with_its_code_location(tmp_path: Path) -> None:
    found = run(bad_deploy_writer(), tmp_path)
    assert (found.hypothesis, found.service, found.deploy) == ("bad_deploy", "payments", "D-1")
    assert [(c.path, c.line, c.function) for c in found.code_locations] == [
        ("payments/app/handlers.py", 26, "verify_callback")
    ]
    assert found.action == {
        "tool": "rollback_deploy",
        "args": {"service": "payments", "deploy": "D-1"},
        "risk_class": "R2",
    }
    assert [s.template for s in found.new_signatures] == [
        "ValueError: invalid signature for charge <n>"
    ]


def test_a_bundle_with_logs_only_still_finds_the_deploy_with_less_confidence(
    tmp_path: Path,
) -> None:
    with_metrics = run(bad_deploy_writer(), tmp_path / "a")
    logs_only = run(bad_deploy_writer(metrics=False), tmp_path / "b")
    assert (logs_only.hypothesis, logs_only.service, logs_only.deploy) == (
        "bad_deploy",
        "payments",
        "D-1",
    )
    assert [a.metric for a in logs_only.anomalies] == ["log_errors_per_minute"]
    assert logs_only.missing == ["metrics"]
    assert logs_only.confidence < with_metrics.confidence


def test_config_change(tmp_path: Path) -> None:
    w = noisy(BundleWriter(after={("payments", "http_error_ratio"): 0.4}))
    w.config_changes.append(
        config_change(
            "C-7", "payments", "BANK_TIMEOUT_MS", 3000, 300, ONSET - timedelta(minutes=12)
        )
    )
    w.errors("payments", "charge {n} gave up: BANK_TIMEOUT_MS reached")
    found = run(w, tmp_path)
    assert (found.hypothesis, found.service, found.config_key) == (
        "config_change",
        "payments",
        "BANK_TIMEOUT_MS",
    )
    assert found.action == {
        "tool": "revert_config",
        "args": {"service": "payments", "key": "BANK_TIMEOUT_MS"},
        "risk_class": "R2",
    }


def test_a_change_named_by_the_error_beats_a_change_by_time_alone(tmp_path: Path) -> None:
    w = bad_deploy_writer()
    # A later config change of the same service that the error does not name.
    w.config_changes.append(
        config_change("C-8", "payments", "FEATURE_X", False, True, ONSET - timedelta(minutes=2))
    )
    found = run(w, tmp_path)
    assert (found.hypothesis, found.deploy) == ("bad_deploy", "D-1")
    assert {f.hypothesis for f in found.findings} == {"bad_deploy", "config_change"}


def test_an_external_upstream_gets_a_ticket_never_a_restart(tmp_path: Path) -> None:
    w = noisy(BundleWriter(after={("payments", "http_error_ratio"): 0.4}))
    w.errors("payments", "bank-api returned 503 for charge {n}", upstream="bank-api")
    found = run(w, tmp_path)
    assert (found.hypothesis, found.service) == ("upstream_degraded", "bank-api")
    assert found.action == {
        "tool": "open_ticket",
        "args": {"service": "bank-api"},
        "risk_class": "R1",
    }
    # Even playbook data that asks for a restart cannot point one at a third party.
    from packs.diagnosis.playbook_data import Action, default_playbook

    rules = default_playbook().model_copy(deep=True)
    rules.hypotheses["upstream_degraded"].action = Action(tool="restart_service", risk_class="R2")
    with opened(tmp_path / "bundle") as bundle:
        again = diagnose(bundle, demo_shop(), rules)
    assert again.action == {
        "tool": "open_ticket",
        "args": {"service": "bank-api"},
        "risk_class": "R1",
    }


def test_upstream_degraded_inside_the_shop(tmp_path: Path) -> None:
    w = noisy(
        BundleWriter(
            after={("orders", "latency_p99_ms"): 3000, ("inventory", "latency_p99_ms"): 3000}
        )
    )
    w.errors("orders", "timeout calling cache after {n}ms", upstream="cache")
    w.errors("inventory", "timeout calling cache after {n}ms", upstream="cache")
    found = run(w, tmp_path)
    assert (found.hypothesis, found.service) == ("upstream_degraded", "cache")
    assert found.related_services == ["cache", "inventory", "orders"]
    assert found.action is not None and found.action["risk_class"] == "R1"


def test_nothing_found_is_unknown_with_what_was_missing(tmp_path: Path) -> None:
    root = tmp_path / "bundle"
    root.mkdir()
    (root / "incident.yaml").write_text(
        "description: 网站有点慢\nreported_at: '2026-10-20T12:00:00+08:00'\n", "utf-8"
    )
    with opened(root) as bundle:
        found = diagnose(bundle, demo_shop())
    assert (found.hypothesis, found.service, found.action, found.confidence) == (
        "unknown",
        None,
        None,
        0.0,
    )
    assert found.missing == ["logs", "metrics", "changes"]
    assert "logs, metrics, changes" in found.summary["en"]


def test_thresholds_are_data(tmp_path: Path) -> None:
    from packs.diagnosis.playbook_data import default_playbook

    w = noisy(
        BundleWriter(
            after={("inventory", "disk_used_ratio"): 0.9, ("inventory", "http_error_ratio"): 0.3}
        )
    )
    w.errors("inventory", "write failed: No space left on device ({n} bytes)")
    rules = default_playbook().model_copy(deep=True)
    with opened(w.write(tmp_path / "bundle")) as bundle:
        assert diagnose(bundle, demo_shop(), rules).hypothesis != "disk_full"  # 0.9 < 0.95
        rules.hypotheses["disk_full"].threshold = 0.85
        assert diagnose(bundle, demo_shop(), rules).hypothesis == "disk_full"
