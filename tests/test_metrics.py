"""/metrics after one session, scraped from daphne (another process): every family is
there with values that match what happened, summed across processes."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import Sum
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from approvals.actions import do_decide
from diagnosis.actions import do_answer, do_create_session
from diagnosis.models import LLMCall, Session
from ingest.models import GateRule
from scenarios_admin.models import Scenario
from tests.api_helpers import call, token_for
from tests.web_helpers import approval_for

pytestmark = pytest.mark.services


def scrape(base: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=20) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = tuple(sorted(sample.labels.items()))
            samples.setdefault(sample.name, {})[key] = sample.value
    return samples


def total(samples: dict[str, Any], name: str, **labels: str) -> float:
    return sum(
        value
        for key, value in samples.get(name, {}).items()
        if all((k, v) in key for k, v in labels.items())
    )


def test_every_family_after_one_session(
    builtin: None, asgi_server: str, make_user: Callable[..., User]
) -> None:
    before = scrape(asgi_server)
    operator = make_user("olga", "operator")
    approver = make_user("abe", "approver")
    token = token_for(operator)

    session = do_create_session(operator, Scenario.objects.get(slug="oil_spill"), "105机位燃油泄漏")
    session.refresh_from_db()
    url = asgi_server.replace("http://", "ws://") + f"/ws/api/sessions/{session.pk}?token={token}"
    # max_queue=None: frames the test leaves unread never stop the client reading, so
    # its close sees the server's close frame (past 16 unread frames websockets stops
    # reading and every close waited out its 10 s timeout).
    with connect(url, open_timeout=10, max_queue=None) as ws:
        for _ in range(session.last_seq):
            ws.recv(timeout=15)
        do_answer(session.pk, operator, "CA1234 发动机运转 持续泄漏")  # pushed live
        session.refresh_from_db()
        while json.loads(ws.recv(timeout=15))["seq"] < session.last_seq:
            pass
    approval = approval_for(session, "dispatch_cleanup_crew")
    do_decide(approval.pk, approver, "approve", "crew on the way", digest=approval.digest)
    assert call("GET", f"/api/v1/diagnosis-sessions/{session.pk}", token).status_code == 200
    GateRule.objects.create(name="all", matchers={}, action="sink")
    Client().post(
        "/ingest/alerts",
        json.dumps({"alerts": [{"labels": {"alertname": "Probe"}}]}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )

    after = scrape(asgi_server)

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert total(after, "aero_sessions", status="waiting_user") == 1
    assert total(after, "aero_sessions", status="completed") == 0
    llm = LLMCall.objects.filter(session=session)
    assert total(after, "aero_llm_calls_total") == llm.count() > 0
    assert total(after, "aero_llm_tokens_total", direction="in") == (
        llm.aggregate(n=Sum("tokens_in"))["n"] or 0
    )
    assert "aero_llm_cost_total" in after
    assert total(after, "aero_approval_wait_seconds_count", risk_class="R1") == 1
    assert total(after, "aero_approval_wait_seconds_bucket", risk_class="R1", le="+Inf") == 1
    assert total(after, "aero_approvals_open", risk_class="R2") >= 1
    assert total(after, "aero_gate_decisions_total", stage="policy", decision="sink") == 1
    assert ("aero_job_queue_depth") in after
    # counted in this process (jobs run inline in tests) and summed by daphne's /metrics
    assert grew("aero_job_duration_seconds_count", outcome="waiting_user") >= 2
    # One notice per committed step (a block of events), so fewer notices than events.
    pushed = grew("aero_event_push_total", outcome="ok")
    assert 5 <= pushed < session.last_seq
    assert grew("aero_ws_connects_total", stream="api", kind="new") == 1
    assert grew("aero_ws_events_sent_total", stream="api") >= session.last_seq
    assert grew("aero_event_commit_to_send_seconds_count", stream="api") >= 1
    assert grew("aero_api_requests_total", method="GET", status="200") >= 1
    assert Session.objects.count() == 1


def test_metrics_need_an_allowed_address_or_the_token(db: None, settings: Any) -> None:
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 403
    settings.AERO_METRICS_ALLOWED_IPS = ["10.1.0.0/16"]
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 403
    settings.AERO_METRICS_TOKEN = "scrape-me"
    remote = Client(REMOTE_ADDR="192.0.2.1")
    assert remote.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me").status_code == 200
    assert remote.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert remote.post("/metrics").status_code == 405


def test_unknown_methods_share_one_label_value(db: None, settings: Any) -> None:
    """Anyone may send any method name to /api/v1/, signed in or not: each one must not
    become a series of its own."""
    from aero.metrics import API_CALLS, API_METHODS

    def methods() -> set[str]:
        return {
            sample.labels["method"] for family in API_CALLS.collect() for sample in family.samples
        }

    for method in ("BREW", "X" * 60, "PROPFIND", "GET"):
        Client().generic(method, "/api/v1/diagnosis-sessions")
    seen = methods()
    assert "other" in seen and "GET" in seen
    assert seen <= API_METHODS | {"other"}, seen
