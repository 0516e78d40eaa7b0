"""Metrics through a real Prometheus (issue 36 item 2): Debian's `prometheus`, started on
its own port and data dir, loaded with an example bundle's metrics.csv; the playbook's
findings from it equal those from the file. A Prometheus that is down, slow or answers an
error fails the read with the reason."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings
from django.urls import reverse

from diagnosis.models import Event, Session, ToolCall
from packs.diagnosis.bundle import Bundle, open_bundle
from packs.diagnosis.evidence import Evidence
from packs.diagnosis.models import MetricsSource
from packs.diagnosis.playbook import diagnose, read_metrics
from packs.diagnosis.playbook_data import Diagnosis
from packs.diagnosis.prometheus import (
    MetricsSourceError,
    PrometheusSource,
    Sample,
    check,
    samples,
)
from packs.diagnosis.system import demo_shop
from tests.prometheus_helpers import fake_server, prometheus_with
from tests.servers import free_port
from tests.web_helpers import login

pytestmark = pytest.mark.services
EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
NAMES = ("ex-deploy-payments", "ex-pool-inventory", "ex-upstream-cache")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Bundle, str]]]:
    """Each example in a Prometheus of its own (their services share names)."""
    opened = {name: open_bundle(EXAMPLES / f"{name}.tar.gz") for name in NAMES}
    try:
        with (
            prometheus_with(opened[NAMES[0]].metrics_path, tmp_path_factory.mktemp("p0")) as first,
            prometheus_with(opened[NAMES[1]].metrics_path, tmp_path_factory.mktemp("p1")) as second,
            prometheus_with(opened[NAMES[2]].metrics_path, tmp_path_factory.mktemp("p2")) as third,
        ):
            urls = dict(zip(NAMES, (first, second, third), strict=True))
            yield {name: (opened[name], urls[name]) for name in NAMES}
    finally:
        for bundle in opened.values():
            bundle.close()


def _rows(bundle: Bundle) -> list[Sample]:
    evidence = Evidence(bundle)
    try:
        rows = evidence.con.execute("SELECT ts, service, metric, value FROM metrics").fetchall()
    finally:
        evidence.close()
    return sorted(
        ((ts, service, metric, float(value)) for ts, service, metric, value in rows),
        key=lambda r: (r[1], r[2], r[0]),
    )


def _findings(found: Diagnosis) -> dict[str, object]:
    return {
        "anomalies": [(a.service, a.metric, a.onset, a.baseline, a.peak) for a in found.anomalies],
        "t0": found.t0,
        "hypothesis": found.hypothesis,
        "service": found.service,
        "deploy": found.deploy,
        "config_key": found.config_key,
        "confidence": found.confidence,
        "problem_type": found.problem_type,
        "candidates": [(f.hypothesis, f.service, f.rank) for f in found.findings],
        "missing": found.missing,
    }


def test_prometheus_answers_the_bundles_samples(loaded: dict[str, tuple[Bundle, str]]) -> None:
    bundle, url = loaded["ex-deploy-payments"]
    rows = _rows(bundle)
    metrics = sorted({r[2] for r in rows})
    since, until = min(r[0] for r in rows), max(r[0] for r in rows)
    got = samples(PrometheusSource(url), metrics, since, until)
    assert len(got) == len(rows) == bundle.metric_rows
    assert got == rows  # every sample once, at its own time: no look-back repeats


@pytest.mark.parametrize("name", NAMES)
def test_findings_from_prometheus_equal_the_bundles(
    loaded: dict[str, tuple[Bundle, str]], name: str
) -> None:
    bundle, url = loaded[name]
    system = demo_shop()
    from_file = diagnose(bundle, system)
    fetched = read_metrics(PrometheusSource(url), bundle)
    from_prometheus = diagnose(replace(bundle, metric_samples=fetched), system)
    assert from_file.anomalies, "the example has anomalies to compare"
    assert _findings(from_prometheus) == _findings(from_file)


def test_a_prometheus_that_is_down_fails_with_the_reason() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(MetricsSourceError, match=f"Prometheus at {url} cannot be reached"):
        check(PrometheusSource(url, timeout=2))


def test_a_slow_prometheus_fails_after_its_timeout() -> None:
    with (
        fake_server(200, b'{"status":"success","data":{}}', delay=3) as url,
        pytest.raises(MetricsSourceError, match=r"did not answer within 0\.5 s"),
    ):
        check(PrometheusSource(url, timeout=0.5))


def test_an_error_answer_fails_with_prometheus_words() -> None:
    body = b'{"status":"error","errorType":"bad_data","error":"parse error at char 3"}'
    with (
        fake_server(400, body) as url,
        pytest.raises(MetricsSourceError, match="HTTP 400: parse error at char 3"),
    ):
        check(PrometheusSource(url))
    with (
        fake_server(502, b"<html>bad gateway</html>") as url,
        pytest.raises(MetricsSourceError, match="HTTP 502 with no Prometheus JSON"),
    ):
        check(PrometheusSource(url))


# --- a session reading a configured Prometheus ------------------------------------------


@pytest.fixture
def _bundles_in_tmp(tmp_path: Path) -> Iterator[None]:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def without_metrics_file(name: str, where: Path) -> Path:
    """The example's folder without its metrics.csv: what a session then knows of
    metrics comes from the configured source only."""
    with tarfile.open(EXAMPLES / f"{name}.tar.gz") as archive:
        archive.extractall(where, filter="data")
    (folder,) = [p for p in where.iterdir() if p.is_dir()]
    (folder / "metrics.csv").unlink()
    return folder


def run(capsys: pytest.CaptureFixture[str], bundle: Path, *options: str) -> dict[str, Any]:
    capsys.readouterr()
    call_command("incident", "run", "--bundle", str(bundle), *options, "--json")
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_a_session_reads_its_metrics_from_the_configured_prometheus(
    builtin: None,
    _bundles_in_tmp: None,
    capsys: pytest.CaptureFixture[str],
    loaded: dict[str, tuple[Bundle, str]],
    tmp_path: Path,
) -> None:
    _, url = loaded["ex-deploy-payments"]
    MetricsSource.objects.create(name="shop-prom", base_url=url, timeout_seconds=10)
    from_file = run(capsys, EXAMPLES / "ex-deploy-payments.tar.gz", "--decide", "approve")
    folder = without_metrics_file("ex-deploy-payments", tmp_path / "x")
    live = run(capsys, folder, "--metrics-source", "shop-prom", "--decide", "approve")

    assert live["metrics"] == {"source": "prometheus", "name": "shop-prom", "base_url": url}
    assert from_file["metrics"]["source"] == "bundle"
    assert live["status"] == from_file["status"] == "completed"
    assert live["root_cause"] == from_file["root_cause"]
    assert live["confidence"] == from_file["confidence"]
    assert live["missing_sources"] == from_file["missing_sources"]
    calls = {c.tool_name: c for c in ToolCall.objects.filter(session_id=live["session"])}
    assert calls["anomalies"].status == "completed"
    first = ToolCall.objects.get(session_id=from_file["session"], tool_name="anomalies")
    assert calls["anomalies"].response_payload == first.response_payload
    assert "metrics from Prometheus shop-prom" in calls["read_bundle"].response_payload["summary"]
    # the session page says where its metrics came from
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw-for-tests"))
    page = client.get(reverse("diagnosis:session-detail", args=[live["session"]])).content
    assert f"Metrics: <strong>Prometheus shop-prom ({url})</strong>" in page.decode()
    page = client.get(reverse("diagnosis:session-detail", args=[from_file["session"]])).content
    assert "Metrics: <strong>the bundle's metrics.csv</strong>" in page.decode()


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("down", "cannot be reached"),
        ("slow", "did not answer within 0.5 s"),
        ("error", "answered HTTP 503: query timed out in expression evaluation"),
    ],
)
def test_a_failing_prometheus_fails_the_metrics_call_and_the_session_says_so(
    builtin: None,
    _bundles_in_tmp: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    case: str,
    reason: str,
) -> None:
    body = b'{"status":"error","errorType":"timeout",'
    body += b'"error":"query timed out in expression evaluation"}'
    server = (
        nullcontext(f"http://127.0.0.1:{free_port()}")
        if case == "down"
        else fake_server(200, b"{}", delay=3)
        if case == "slow"
        else fake_server(503, body)
    )
    folder = without_metrics_file("ex-deploy-payments", tmp_path / "x")
    with server as url:
        MetricsSource.objects.create(name="shop-prom", base_url=url, timeout_seconds=0.5)
        result = run(capsys, folder, "--metrics-source", "shop-prom", "--decide", "approve")

    call = ToolCall.objects.get(session_id=result["session"], tool_name="anomalies")
    assert call.status == "failed"
    assert f"Prometheus at {url} {reason}" in call.error
    assert Event.objects.filter(
        session_id=result["session"], type="tool.call_failed", payload__call_id=call.call_id
    ).exists()
    # the session goes on with the logs, deploys and code, and says what it lacked
    assert result["status"] in ("completed", "waiting")
    assert "metrics" in result["missing_sources"]
    other = {c.tool_name: c.status for c in ToolCall.objects.filter(session_id=result["session"])}
    assert other["log_signatures"] == other["deploys"] == "completed"


def test_an_unknown_metrics_source_is_refused_and_creates_nothing(
    builtin: None, _bundles_in_tmp: None
) -> None:
    MetricsSource.objects.create(name="off", base_url="http://127.0.0.1:1", enabled=False)
    with pytest.raises(CommandError, match=r"Unknown metrics source off \(enabled: -\)"):
        call_command(
            "incident",
            "run",
            "--bundle",
            str(EXAMPLES / "ex-deploy-payments.tar.gz"),
            "--metrics-source",
            "off",
        )
    assert not Session.objects.exists()


def test_the_web_form_starts_a_session_on_a_configured_prometheus(
    builtin: None,
    _bundles_in_tmp: None,
    loaded: dict[str, tuple[Bundle, str]],
    make_user: Any,
) -> None:
    _, url = loaded["ex-deploy-payments"]
    client = login(make_user("alice", "operator"))
    form = client.get(reverse("diagnosis_pack:new")).content.decode()
    assert "Metrics from" not in form  # nothing configured: the bundle's file, no choice
    MetricsSource.objects.create(name="shop-prom", base_url=url, timeout_seconds=10)
    MetricsSource.objects.create(name="old", base_url=url, enabled=False)
    form = client.get(reverse("diagnosis_pack:new")).content.decode()
    assert f"Prometheus shop-prom ({url})" in form and "Prometheus old" not in form

    chosen = {"demo": "ex-deploy-payments", "metrics_source": "old"}
    refused = client.post(reverse("diagnosis_pack:new"), chosen)
    assert refused.status_code == 400 and "Select a valid choice" in refused.content.decode()
    assert not Session.objects.exists()

    chosen["metrics_source"] = "shop-prom"
    response = client.post(reverse("diagnosis_pack:new"), chosen)
    assert response.status_code == 302
    page = client.get(response["Location"]).content.decode()
    assert f"Metrics: <strong>Prometheus shop-prom ({url})</strong>" in page
    session = Session.objects.get()
    requested = Event.objects.get(session=session, type="diagnosis.requested").payload
    assert requested["metrics"] == {"source": "prometheus", "name": "shop-prom", "base_url": url}
