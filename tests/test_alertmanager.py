"""The real Prometheus Alertmanager (Debian's package, scripts/install-system-deps.sh) sends
its webhook to AERO served by daphne; amtool fires, repeats, resolves and fires again an
alert, then, after its session was closed, fires a new incident. Repeats within an
episode are dropped; a firing after its resolution reaches the incident, and the new
incident after the close opens a session of its own."""

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

from diagnosis.actions import do_cancel
from diagnosis.models import ENDED_STATUSES, Event, Session
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


def amtool(url: str, *args: str, description: str = STAND_FUEL_LEAK) -> None:
    subprocess.run(
        [
            "amtool",
            "alert",
            "add",
            *LABELS,
            *args,
            f"--annotation=description={description}",
            f"--alertmanager.url={url}",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )


def resolve(url: str, description: str = STAND_FUEL_LEAK) -> None:
    ended = (datetime.now(UTC) - timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    amtool(url, f"--end={ended}", description=description)


def kept(status: str) -> list[Observation]:
    return list(Observation.objects.filter(status=status).exclude(decision="drop").order_by("id"))


def test_amtool_fire_repeat_resolve_refire_and_a_new_incident_after_close(
    alertmanager: str,
) -> None:
    settings = GateSettings.load()
    settings.severity_scores = {"critical": 60}
    settings.save()
    GateRule.objects.create(
        name="fuel leaks",
        matchers={"alertname": "FuelLeak"},
        scenario=Scenario.objects.get(slug="oil_spill"),
    )

    # fire, and Alertmanager repeats the notification every 2 s
    amtool(alertmanager)
    wait_for(lambda: len(kept("firing")) == 1, 60, "the firing alert never arrived")
    wait_for(
        lambda: Observation.objects.filter(status="firing").count() >= 3,
        60,
        "no repeated notifications",
    )
    session = Session.objects.get()
    assert session.created_by.username == "alertmanager-bot"
    first = kept("firing")[0]
    assert (first.decision, first.stage, first.session) == ("deliver", "policy", session)
    assert first.group_key.startswith("{}:") and "FuelLeak" in first.group_key
    repeats = Observation.objects.filter(status="firing", id__gt=first.pk)
    assert {(o.decision, o.stage) for o in repeats} == {("drop", "dedup")}

    # resolve, then fire again within the dedup window: a new episode, not a repeat
    resolve(alertmanager)
    wait_for(lambda: len(kept("resolved")) == 1, 60, "the resolved notice never arrived")
    assert (kept("resolved")[0].decision, kept("resolved")[0].session) == ("deliver", session)
    amtool(alertmanager)
    wait_for(lambda: len(kept("firing")) == 2, 60, "the firing after resolution was dropped")
    refired = kept("firing")[1]
    assert refired.starts_at != first.starts_at
    assert (refired.decision, refired.stage) == ("deliver", "policy")
    session.refresh_from_db()
    if not session.is_ended:  # the agent may have finished it on its own meanwhile
        assert refired.session == session
    wait_for(
        lambda: Observation.objects.filter(status="firing", id__gt=refired.pk).count() >= 2,
        60,
        "no repeated notifications of the second firing",
    )
    assert kept("firing") == [first, refired], "a repeat of the second firing was kept"

    # resolve and close the incident; a new one (new description) opens a new session
    resolve(alertmanager)
    wait_for(lambda: len(kept("resolved")) == 2, 60, "the second resolved notice never arrived")
    for open_session in Session.objects.exclude(status__in=ENDED_STATUSES):
        do_cancel(open_session.pk, open_session.created_by, "handled")
    amtool(alertmanager, description="Fuel again at stand 105, a new leak.")
    wait_for(lambda: len(kept("firing")) == 3, 60, "the new incident after the close was dropped")
    new = kept("firing")[2]
    assert (new.decision, new.stage) == ("deliver", "policy")
    assert new.session is not None and new.session not in (first.session, refired.session)
    assert new.annotations["description"] == "Fuel again at stand 105, a new leak."
    opening = Event.objects.get(session=new.session, type="user.message")
    assert "a new leak" in opening.payload["text"]
    alerts = Event.objects.filter(session=session, type="timeline.appended", payload__kind="alert")
    assert [e.payload["status"] for e in alerts.order_by("seq")][:2] == ["firing", "resolved"]
