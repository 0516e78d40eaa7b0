"""Metrics through a real Prometheus (issue 36 item 2): Debian's `prometheus`, started on
its own port and data dir, loaded with an example bundle's metrics.csv; the playbook's
findings from it equal those from the file. A Prometheus that is down, slow or answers an
error fails the read with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from packs.diagnosis.bundle import Bundle, open_bundle
from packs.diagnosis.evidence import Evidence
from packs.diagnosis.playbook import Diagnosis, diagnose, read_metrics
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
