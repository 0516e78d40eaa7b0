"""The diagnosis page's pictures, server-rendered SVG an on-call engineer reads at a
glance: each anomalous metric with its onset and the blamed change marked, and the
service graph with the root cause and the services around it highlighted; readable
without script, by a screen reader (title, desc, caption), at 400 px and in Chinese."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from diagnosis.models import Session, ToolCall
from packs.diagnosis.charts import MAX_POINTS, downsample, metric_chart, service_graph
from packs.diagnosis.sessions import start_from_bundle
from packs.diagnosis.system import demo_shop
from tests.web_helpers import login

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"


def _figure(page: str, testid: str) -> list[str]:
    return re.findall(rf'<figure [^>]*data-testid="{testid}".*?</figure>', page, re.S)


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


@pytest.mark.services
def test_a_concluded_diagnosis_shows_its_metric_chart_and_service_graph(
    builtin: None, alice: User
) -> None:
    session = start_from_bundle(alice, EXAMPLES / "ex-deploy-payments.tar.gz", {"producer": "test"})
    session = Session.objects.get(pk=session.pk)
    cause = session.snapshot["root_cause"]
    page = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk])).content
    html = page.decode()

    charts = _figure(html, "metric-chart")
    assert charts, "each anomalous metric has its chart"
    recorded = ToolCall.objects.get(session=session, call_id="ev-anomalies").response_payload
    first = recorded["anomalies"][0]
    assert 2 <= len(first["series"]) <= MAX_POINTS  # the series is in the log
    chart = next(c for c in charts if f'data-metric="{first["metric"]}"' in c)
    assert 'viewBox="0 0 400 120" width="100%"' in chart and 'role="img"' in chart
    assert re.search(r"<title id=\"chart-1-title\">.+</title>", chart)
    onset = datetime.fromisoformat(first["onset"]).strftime("%H:%M")
    assert 'data-testid="onset-marker"' in chart and f"onset {onset}" in chart
    assert f"anomalous from {onset}" in chart  # the text alternative says it too
    # the blamed deploy is marked where it happened
    assert 'data-testid="change-marker"' in chart and f"deploy {cause['deploy']}" in chart
    assert (
        "<polyline" in chart and "<script" not in html.split('data-testid="metric-chart"')[1][:5000]
    )

    graph = _figure(html, "service-graph")[0]
    assert 'width="100%"' in graph and '<desc id="service-graph-desc">' in graph
    root = re.search(r'<g class="node [^"]*\broot\b[^"]*" data-service="([^"]+)"', graph)
    assert root is not None and root.group(1) == cause["service"] == "payments"
    around = [s for s in cause["related_services"] if s != cause["service"]]
    assert around, "the example has a blast radius"
    for service in around:
        assert re.search(rf'<g class="node [^"]*\brelated\b[^"]*" data-service="{service}"', graph)
    assert f"Root cause: {cause['service']}." in graph
    assert 'class="edge hot"' in graph

    with override_settings(LANGUAGE_CODE="zh-hans"):
        chinese = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk]))
    text = chinese.content.decode()
    assert "服务依赖图" in text and "根因" in text and "异常指标" in text
    assert "起始" in _figure(text, "metric-chart")[0]


def test_the_chart_marks_onset_and_change_only_inside_the_window() -> None:
    anomaly = {
        "service": "payments",
        "metric": "http_error_ratio",
        "onset": "2026-01-01T10:05:00+00:00",
        "baseline": 0.01,
        "peak": 0.4,
        "series": [[f"2026-01-01T10:{m:02d}:00+00:00", 0.4 if m >= 5 else 0.01] for m in range(10)],
    }
    inside = metric_chart(1, anomaly, {"label": "deploy D-1", "at": "2026-01-01T10:04:00+00:00"})
    assert inside is not None and inside.onset is not None and inside.change is not None
    assert inside.change.x < inside.onset.x  # the deploy came first, to the left
    assert 40 <= inside.onset.x <= 392
    outside = metric_chart(1, anomaly, {"label": "deploy D-1", "at": "2025-12-31T09:00:00+00:00"})
    assert outside is not None and outside.change is None
    assert metric_chart(1, {**anomaly, "series": []}, None) is None  # an older session


def test_downsampling_keeps_a_spike() -> None:
    start = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
    samples = [(start.replace(minute=i % 60, hour=i // 60), 1.0) for i in range(1000)]
    samples[517] = (samples[517][0], 99.0)
    kept = downsample(samples)
    assert len(kept) <= MAX_POINTS and max(v for _, v in kept) == 99.0


def test_the_graph_puts_callers_above_what_they_call() -> None:
    graph = service_graph(demo_shop(), "inventory", ["orders", "gateway"])
    by_name = {n.name: n for n in graph.nodes}
    for name, spec in demo_shop().services.items():
        for dependency in spec.depends_on:
            assert by_name[name].y < by_name[dependency].y, (name, dependency)
    assert by_name["inventory"].role == "root" and by_name["orders"].role == "related"
    assert all(n.left >= 0 and n.left + graph.node_w <= graph.width for n in graph.nodes)
    assert [e.hot for e in graph.edges].count(True) == 1  # orders -> inventory


@pytest.mark.services
def test_replay_shows_the_diagnosis_panel_as_it_stood_at_each_step(
    builtin: None, alice: User, carol: User
) -> None:
    """An auditor replaying a diagnosis sees its panel, not the apron's facts: before the
    evidence, nothing found; the similar cases from the step that searched them (with the
    evidence, before the conclusion); at the end, the root cause, the chart and the
    similar cases; the session's own save button never."""
    from diagnosis.models import Event
    from packs.diagnosis.names import SIMILAR

    session = start_from_bundle(alice, EXAMPLES / "ex-deploy-payments.tar.gz", {"producer": "test"})
    session = Session.objects.get(pk=session.pk)
    client = login(carol)
    url = reverse("replay:replay-step", args=[session.pk])
    first = Event.objects.filter(session=session).order_by("seq").first()
    assert first is not None
    early = client.get(url, {"seq": first.seq}).content.decode()
    assert 'data-testid="root-cause"' not in early and not _figure(early, "metric-chart")
    assert 'class="facts"' not in early, "the apron's facts table is not a diagnosis's"

    assert "Similar past cases are searched with the evidence." in early
    similar = Event.objects.get(session=session, type=SIMILAR).seq
    before = client.get(url, {"seq": similar - 1}).content.decode()
    assert _figure(before, "metric-chart"), "the anomalies were read before the search"
    assert 'data-testid="similar-cases"' not in before, "not searched yet at this step"
    searched = client.get(url, {"seq": similar}).content.decode()
    assert 'data-item="KB-011"' in searched, "the search's best case, at once"
    assert 'data-testid="root-cause"' not in searched, "searched with the evidence, not after"
    last = client.get(url, {"seq": session.last_seq}).content.decode()
    assert 'data-testid="root-cause"' in last and session.snapshot["root_cause"]["service"] in last
    assert _figure(last, "metric-chart") and _figure(last, "service-graph")
    assert 'data-testid="similar-cases"' in last, "the similar cases once recorded"
    assert 'data-testid="save-knowledge"' not in last


def _panel_of(page: str) -> str:
    found = re.search(r'<section id="session-facts".*?</section>', page, re.S)
    assert found, "the page has its facts panel"
    return found.group(0)


def _without_graph(panel: str) -> str:
    return re.sub(r'<figure [^>]*data-testid="service-graph".*?</figure>', "", panel, flags=re.S)


@pytest.mark.services
def test_an_auditor_sees_the_panel_masked_as_replay_masks_it(
    builtin: None, alice: User, carol: User
) -> None:
    """What the rule hides for an auditor (the arguments of the R2 fix waiting for its
    approval: the service, the deploy) is hidden in the diagnosis panel too, on the
    session page as on replay; an operator sees it."""
    from diagnosis.eventlog.masking import mask_of

    session = start_from_bundle(alice, EXAMPLES / "ex-deploy-payments.tar.gz", {"producer": "test"})
    session = Session.objects.get(pk=session.pk)
    hidden = {value for value in mask_of(session.pk).secrets if len(value) > 3}
    assert hidden, "the fix is masked for auditors"
    page = reverse("diagnosis:session-detail", args=[session.pk])
    operators = _panel_of(login(alice).get(page).content.decode())
    auditors = _panel_of(login(carol).get(page).content.decode())
    # The service graph draws the whole system, each service by name; for the auditor it
    # marks no node as the (masked) root cause.
    assert 'data-role="root"' in operators and 'data-role="root"' not in auditors
    operators, auditors = (_without_graph(panel) for panel in (operators, auditors))
    replay = login(carol).get(
        reverse("replay:replay-step", args=[session.pk]), {"seq": session.last_seq}
    )
    replayed = re.search(
        r'<section class="card" id="replay-state">.*?</section>', replay.content.decode(), re.S
    )
    assert replayed is not None
    for value in hidden:
        # as a whole value, as the mask reads one ("payments/app/x.py" is a path)
        whole = re.compile(rf"(?<![0-9A-Za-z_/-]){re.escape(value)}(?![0-9A-Za-z_/-])")
        assert whole.search(operators), f"{value} is on the operator's panel"
        assert not whole.search(auditors), f"{value} is masked on the auditor's panel"
        assert not whole.search(_without_graph(replayed.group(0))), f"{value} is masked on replay"
    assert 'data-testid="root-cause"' in auditors, "the auditor still sees a root cause"
