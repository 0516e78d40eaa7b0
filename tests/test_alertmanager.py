"""The real Prometheus Alertmanager (Debian's package, scripts/install-system-deps.sh) sends
its webhook to AERO served by daphne; amtool fires, repeats and resolves an alert. One
session opens; the repeats and the resolved notice do not open more."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from diagnosis.models import Event, Session
from ingest.models import GateRule, GateSettings, Observation
from scenarios_admin.models import Scenario
from tests.api_helpers import token_for
from tests.servers import free_port
from tests.web_helpers import STAND_FUEL_LEAK

pytestmark = pytest.mark.services
LABELS = ["alertname=FuelLeak", "severity=critical", "stand=105"]


@pytest.fixture
def alertmanager(
    builtin: None, asgi_server: str, make_user: Callable[..., User], tmp_path: Path
) -> Iterator[str]:
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None or shutil.which("amtool") is None:
        pytest.fail("Alertmanager is not installed (scripts/install-system-deps.sh)")
    token = token_for(make_user("alertmanager-bot", "operator"))
    config = tmp_path / "alertmanager.yml"
    config.write_text(
        f"""
route:
  receiver: aero
  group_by: [alertname, stand]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 2s
receivers:
  - name: aero
    webhook_configs:
      - url: {asgi_server}/ingest/alertmanager
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials: {token}
"""
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "alertmanager.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: _ready(url), 30, f"Alertmanager did not start:\n{log.read_text()}")
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], limit: float, message: str) -> None:
    """A limit on waiting for the other processes, not a speed check."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(message)
        time.sleep(0.3)


def amtool(url: str, *args: str) -> None:
    subprocess.run(
        ["amtool", "alert", "add", *LABELS, *args, f"--alertmanager.url={url}"],
        check=True,
        capture_output=True,
        timeout=30,
    )


def test_amtool_alerts_open_one_session(alertmanager: str) -> None:
    settings = GateSettings.load()
    settings.severity_scores = {"critical": 60}
    settings.save()
    GateRule.objects.create(
        name="fuel leaks",
        matchers={"alertname": "FuelLeak"},
        scenario=Scenario.objects.get(slug="oil_spill"),
    )

    amtool(alertmanager, f"--annotation=description={STAND_FUEL_LEAK}")
    wait_for(
        lambda: Observation.objects.filter(decision="deliver").exists(),
        60,
        "the firing alert never arrived",
    )
    # Alertmanager repeats the notification every 2 s; amtool fires the same alert again
    amtool(alertmanager, f"--annotation=description={STAND_FUEL_LEAK}")
    wait_for(
        lambda: Observation.objects.filter(status="firing").count() >= 3,
        60,
        "no repeated notifications",
    )
    ended = (datetime.now(UTC) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    amtool(alertmanager, f"--end={ended}", f"--annotation=description={STAND_FUEL_LEAK}")
    wait_for(
        lambda: Observation.objects.filter(status="resolved").exists(),
        60,
        "the resolved notice never arrived",
    )

    session = Session.objects.get()
    assert session.created_by.username == "alertmanager-bot"
    firing = list(Observation.objects.filter(status="firing").order_by("id"))
    assert (firing[0].decision, firing[0].stage, firing[0].session) == (
        "deliver",
        "policy",
        session,
    )
    assert firing[0].group_key.startswith("{}:") and "FuelLeak" in firing[0].group_key
    assert {(o.decision, o.stage) for o in firing[1:]} == {("drop", "dedup")}
    resolved = Observation.objects.get(status="resolved")
    assert (resolved.decision, resolved.session) == ("deliver", session)
    alerts = Event.objects.filter(session=session, type="timeline.appended", payload__kind="alert")
    assert [e.payload["status"] for e in alerts.order_by("seq")] == ["firing", "resolved"]
    assert Session.objects.count() == 1
