"""Alerts in through the gate: every stage's decision, one session per alert group, the
agent's own output kept out, authentication, and config snapshots that survive a bad
reload."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

from aero.models import AuditLog
from diagnosis.actions import do_cancel
from diagnosis.maintenance import run_periodic_tasks
from diagnosis.models import Event, Session
from ingest.config import ConfigError, GateConfigProvider, build_snapshot, provider
from ingest.gate import Alert, decide
from ingest.models import GateRule, GateSettings, Observation
from ingest.schemas import MAX_LABEL_VALUE
from scenarios_admin.models import Scenario
from tests.api_helpers import token_for
from tests.web_helpers import STAND_FUEL_LEAK

SECRET = "ingest-secret-for-tests"


def snapshot(**gate: Any) -> Any:
    rules = gate.pop("rules", None)
    if rules is None:
        rules = [
            {
                "name": "fuel",
                "matchers": {"alertname": "FuelLeak.*"},
                "scenario": "oil_spill",
                "base_score": 10,
                "group_by": ["alertname", "stand"],
            },
            {"name": "noise", "matchers": {"alertname": "Heartbeat"}, "action": "drop"},
        ]
    settings = {
        "deliver_threshold": 50,
        "sink_threshold": 20,
        "severity_scores": {"critical": 60, "warning": 15},
        **gate,
    }
    return build_snapshot("test", settings, rules, {"oil_spill"})


def alert(status: str = "firing", **labels: str) -> Alert:
    return Alert(
        source="generic",
        status=status,
        labels={"alertname": "FuelLeak", "stand": "105", "severity": "critical", **labels},
        annotations={"description": STAND_FUEL_LEAK},
    )


def never(*_: Any) -> None:
    return None


def always(*_: Any) -> object:
    return object()  # the observation repeated


# --- the stages, as plain data ---------------------------------------------------------


def test_each_stage_decides_and_says_so() -> None:
    config = snapshot()

    own = decide(Alert(source="agent:reasoning", status="firing", labels={}), config, never)
    assert (own.decision, own.stage) == ("drop", "loop")
    labelled = decide(alert(aero_origin="agent"), config, never)
    assert (labelled.decision, labelled.stage) == ("drop", "loop")

    unmatched = decide(alert(alertname="DiskFull"), config, never)
    assert (unmatched.decision, unmatched.stage) == ("sink", "match")
    dropped_unmatched = decide(alert(alertname="DiskFull"), snapshot(unmatched="drop"), never)
    assert dropped_unmatched.decision == "drop"

    critical = decide(alert(), config, never)
    assert (critical.decision, critical.stage, critical.score) == ("deliver", "policy", 70)
    assert critical.group_key == "generic:fuel:{alertname=FuelLeak,stand=105}"
    warning = decide(alert(severity="warning"), config, never)
    assert (warning.decision, warning.score) == ("sink", 25)
    info = decide(alert(severity="info"), config, never)
    assert (info.decision, info.stage) == ("drop", "policy")
    forced = decide(alert(alertname="Heartbeat"), config, never)
    assert (forced.decision, forced.stage) == ("drop", "policy")

    repeat = decide(alert(), config, always)
    assert (repeat.decision, repeat.stage) == ("drop", "dedup")
    unmatched_repeat = decide(alert(alertname="DiskFull"), config, always)
    assert (unmatched_repeat.decision, unmatched_repeat.stage) == ("drop", "dedup")
    no_window = decide(alert(), snapshot(dedup_window_seconds=0), always)
    assert no_window.decision == "deliver"


def test_the_fingerprint_is_the_label_set_when_none_is_sent() -> None:
    a = decide(alert(), snapshot(), never).fingerprint
    assert a == decide(alert(), snapshot(), never).fingerprint
    assert a != decide(alert(stand="106"), snapshot(), never).fingerprint


@pytest.mark.parametrize(
    ("gate", "rules", "message"),
    [
        ({"sink_threshold": 90}, None, "sink_threshold (90) is above deliver_threshold"),
        ({}, [{"name": "x", "matchers": {"alertname": "("}}], "bad regex for alertname"),
        ({}, [{"name": "x", "scenario": "gone"}], "scenario 'gone' does not exist"),
        ({}, [{"name": "x", "action": "deliver"}], "always-deliver needs a scenario"),
        ({}, [{"name": "x"}, {"name": "x"}], "the name is used twice"),
        ({"severity_scores": {"critical": "high"}}, None, "severity_scores.critical"),
    ],
)
def test_invalid_configurations_are_refused_with_the_reason(
    gate: dict[str, Any], rules: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        snapshot(rules=rules, **gate) if rules is not None else snapshot(**gate)


# --- database-backed: snapshots and admin ---------------------------------------------


@pytest.fixture
def gate_rules(builtin: None) -> Iterator[GateRule]:
    provider.reset()
    settings = GateSettings.load()
    settings.severity_scores = {"critical": 60, "warning": 15}
    settings.save()
    rule = GateRule.objects.create(
        name="fuel",
        matchers={"alertname": "FuelLeak.*"},
        scenario=Scenario.objects.get(slug="oil_spill"),
        base_score=10,
        group_by=["alertname", "stand"],
    )
    yield rule
    provider.reset()


@pytest.mark.services
def test_an_admin_save_swaps_the_snapshot_and_a_bad_one_keeps_the_old(
    gate_rules: GateRule, caplog: pytest.LogCaptureFixture, admin_client: Client
) -> None:
    before = provider.current()
    assert [r.name for r in before.rules] == ["fuel"]

    GateRule.objects.create(name="disk", matchers={"alertname": "Disk.*"})
    after = provider.current()
    assert after is not before and [r.name for r in after.rules] == ["fuel", "disk"]
    assert [r.name for r in before.rules] == ["fuel"], "a snapshot never changes"

    # written around the admin form's validation (the form refuses it)
    GateRule.objects.create(name="broken", matchers={"alertname": "(unclosed"})
    assert provider.current() is after
    assert "bad regex for alertname" in provider.last_error
    assert "keeping db:" in caplog.text
    page = admin_client.get("/admin/ingest/gaterule/").content.decode()
    assert "The last gate reload failed" in page and "bad regex" in page

    GateRule.objects.filter(name="broken").delete()
    assert [r.name for r in provider.current().rules] == ["fuel", "disk"]
    assert provider.last_error == ""


@pytest.mark.services
def test_the_admin_form_refuses_a_bad_regex(gate_rules: GateRule, admin_client: Client) -> None:
    response = admin_client.post(
        "/admin/ingest/gaterule/add/",
        {
            "name": "bad",
            "position": 1,
            "enabled": "on",
            "matchers": '{"alertname": "("}',
            "base_score": 0,
            "action": "auto",
            "group_by": "[]",
        },
    )
    assert response.status_code == 200
    assert "Bad regular expression" in response.content.decode()
    assert not GateRule.objects.filter(name="bad").exists()


@pytest.mark.services
def test_a_watched_file_reloads_by_stamp_and_hash(
    builtin: None, tmp_path: Path, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gate.yaml"
    path.write_text("gate: {deliver_threshold: 40}\nrules:\n  - {name: a, matchers: {x: y}}\n")
    settings.AERO_GATE_FILE = str(path)
    gate = GateConfigProvider()
    first = gate.current()
    assert first.version.startswith("file:") and first.deliver_threshold == 40

    gate._checked_at = 0
    path.touch()  # new stamp, same content: no reload
    assert gate.current() is first

    path.write_text("gate: {deliver_threshold: 45}\nrules: []\n")
    gate._checked_at = 0
    second = gate.current()
    assert second.deliver_threshold == 45 and second is not first

    path.write_text("gate: {deliver_threshold: 10, sink_threshold: 30}\n")
    gate._checked_at = 0
    assert gate.current() is second
    assert "sink_threshold (30) is above" in gate.last_error


# --- over HTTP ------------------------------------------------------------------------


def post(path: str, body: Any, credential: str | None = SECRET) -> Any:
    headers: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {credential}"} if credential else {}
    return Client().post(path, json.dumps(body), content_type="application/json", **headers)


def v4(status: str, *alerts: dict[str, Any], group: str = '{}:{alertname="FuelLeak"}') -> Any:
    """A webhook body as Alertmanager 0.25 sends it (recorded shape)."""
    return {
        "receiver": "aero",
        "status": status,
        "alerts": list(alerts),
        "groupLabels": {"alertname": "FuelLeak"},
        "commonLabels": {"alertname": "FuelLeak"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": group,
        "truncatedAlerts": 0,
    }


def am_alert(
    status: str = "firing",
    stand: str = "105",
    fingerprint: str = "a1b2c3",
    starts: str = "2026-11-23T10:00:00Z",
    description: str = STAND_FUEL_LEAK,
) -> Any:
    return {
        "status": status,
        "labels": {"alertname": "FuelLeak", "severity": "critical", "stand": stand},
        "annotations": {"description": description, "summary": f"fuel on stand {stand}"},
        "startsAt": starts,
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-23T10:05:00Z",
        "generatorURL": "http://prometheus/graph",
        "fingerprint": fingerprint,
    }


@pytest.mark.services
def test_one_session_per_group_repeats_and_resolved_do_not_open_more(
    gate_rules: GateRule, settings: Any, admin_client: Client
) -> None:
    settings.AERO_INGEST_SECRET = SECRET

    first = post("/ingest/alertmanager", v4("firing", am_alert()))
    assert first.status_code == 200
    decision = first.json()["decisions"][0]
    assert (decision["decision"], decision["stage"]) == ("deliver", "policy")
    assert decision["reason"].endswith("opened a session")
    session = Session.objects.get(pk=decision["session_id"])
    assert session.created_by.username == "alertmanager"
    assert session.snapshot["fields"]["position"] == "105", "the agent read the alert"

    repeat = post("/ingest/alertmanager", v4("firing", am_alert())).json()["decisions"][0]
    assert (repeat["decision"], repeat["stage"]) == ("drop", "dedup")

    # another alert of the group (outside any dedup) joins the open session
    sibling = post("/ingest/alertmanager", v4("firing", am_alert(fingerprint="d4e5f6")))
    joined = sibling.json()["decisions"][0]
    assert joined["decision"] == "deliver" and joined["session_id"] == str(session.pk)
    assert joined["reason"].endswith("appended to the group's open session")

    resolved = post("/ingest/alertmanager", v4("resolved", am_alert("resolved")))
    done = resolved.json()["decisions"][0]
    assert done["decision"] == "deliver" and done["session_id"] == str(session.pk)

    assert Session.objects.count() == 1
    alerts = Event.objects.filter(session=session, type="timeline.appended", payload__kind="alert")
    assert [e.payload["status"] for e in alerts.order_by("seq")] == ["firing", "firing", "resolved"]
    recorded = list(Observation.objects.order_by("id").values_list("decision", "stage"))
    assert recorded == [
        ("deliver", "policy"),
        ("drop", "dedup"),
        ("deliver", "policy"),
        ("deliver", "policy"),
    ]
    dropped = Observation.objects.get(decision="drop")
    assert dropped.labels == {} and dropped.annotations == {}, "a drop keeps no content"
    assert AuditLog.objects.filter(action="ingest.delivered", session_id=session.pk).count() == 3
    page = admin_client.get(f"/sessions/{session.pk}/")
    assert "Alert FuelLeak resolved from alertmanager</span>" in page.content.decode()


def outcome(response: Any) -> tuple[str, str, Any]:
    decision = response.json()["decisions"][0]
    return decision["decision"], decision["stage"], decision["session_id"]


@pytest.mark.services
def test_a_firing_after_its_resolution_is_a_new_episode_not_a_repeat(
    gate_rules: GateRule, settings: Any
) -> None:
    """Fire, resolve and fire again within the dedup window: the second firing reaches
    the group's open session (the incident reopens), and only its own repeat is dropped."""
    settings.AERO_INGEST_SECRET = SECRET
    fired = outcome(post("/ingest/alertmanager", v4("firing", am_alert())))
    assert fired[:2] == ("deliver", "policy")
    resolved = outcome(post("/ingest/alertmanager", v4("resolved", am_alert("resolved"))))
    assert resolved == ("deliver", "policy", fired[2])
    again = am_alert(starts="2026-11-23T10:07:00Z")
    refired = outcome(post("/ingest/alertmanager", v4("firing", again)))
    assert refired == ("deliver", "policy", fired[2]), "the new firing was dropped as a repeat"
    assert outcome(post("/ingest/alertmanager", v4("firing", again)))[:2] == ("drop", "dedup")
    alerts = Event.objects.filter(session_id=fired[2], type="timeline.appended")
    statuses = [e.payload["status"] for e in alerts.filter(payload__kind="alert").order_by("seq")]
    assert statuses == ["firing", "resolved", "firing"]


@pytest.mark.services
def test_a_firing_after_its_session_ended_opens_a_new_incident(
    gate_rules: GateRule, settings: Any
) -> None:
    """The session of an alert is canceled: a repeat of the same firing (same startsAt)
    is no longer a repeat of anything open, and opens a new session; so does a new
    incident with a new startsAt after the first was resolved."""
    settings.AERO_INGEST_SECRET = SECRET
    first = outcome(post("/ingest/alertmanager", v4("firing", am_alert())))
    session = Session.objects.get(pk=first[2])
    do_cancel(session.pk, session.created_by, "noise")

    repeat = outcome(post("/ingest/alertmanager", v4("firing", am_alert())))
    assert repeat[:2] == ("deliver", "policy") and repeat[2] != first[2]
    assert outcome(post("/ingest/alertmanager", v4("firing", am_alert())))[:2] == ("drop", "dedup")

    do_cancel(repeat[2], session.created_by, "handled")
    post("/ingest/alertmanager", v4("resolved", am_alert("resolved")))
    new = am_alert(starts="2026-11-23T10:09:00Z", description="Fuel again, now at stand 105.")
    third = outcome(post("/ingest/alertmanager", v4("firing", new)))
    assert third[:2] == ("deliver", "policy") and third[2] not in (first[2], repeat[2])
    assert Session.objects.count() == 3
    opened = Session.objects.get(pk=third[2])
    assert "Fuel again" in opened.events.get(type="user.message").payload["text"]


@pytest.mark.services
def test_a_repeat_keeps_what_it_carries_that_its_episode_has_not(
    gate_rules: GateRule, settings: Any
) -> None:
    settings.AERO_INGEST_SECRET = SECRET
    post("/ingest/alertmanager", v4("firing", am_alert()))
    same = outcome(post("/ingest/alertmanager", v4("firing", am_alert())))
    changed = am_alert(description="The leak has reached the drain.")
    other = outcome(post("/ingest/alertmanager", v4("firing", changed)))
    assert same[:2] == other[:2] == ("drop", "dedup")
    drops = list(Observation.objects.filter(decision="drop").order_by("id"))
    assert drops[0].annotations == {}, "an identical repeat keeps nothing twice"
    assert drops[1].annotations["description"] == "The leak has reached the drain."


@pytest.mark.services
def test_unmatched_repeats_are_deduplicated(gate_rules: GateRule, settings: Any) -> None:
    settings.AERO_INGEST_SECRET = SECRET
    body = {"alerts": [{"labels": {"alertname": "DiskFull", "host": "db1"}}]}
    assert outcome(post("/ingest/alerts", body))[:2] == ("sink", "match")
    assert outcome(post("/ingest/alerts", body))[:2] == ("drop", "dedup")
    resolved = {"alerts": [{"status": "resolved", "labels": body["alerts"][0]["labels"]}]}
    assert outcome(post("/ingest/alerts", resolved))[:2] == ("sink", "match")
    assert outcome(post("/ingest/alerts", body))[:2] == ("sink", "match")


@pytest.mark.services
def test_a_resolved_notice_without_an_open_session_is_sunk(
    gate_rules: GateRule, settings: Any
) -> None:
    settings.AERO_INGEST_SECRET = SECRET
    body = post("/ingest/alertmanager", v4("resolved", am_alert("resolved"))).json()
    assert (body["decisions"][0]["decision"], body["decisions"][0]["stage"]) == ("sink", "deliver")
    assert Session.objects.count() == 0


@pytest.mark.services
def test_generic_alerts_and_the_agents_own_output(
    gate_rules: GateRule, make_user: Callable[..., User]
) -> None:
    token = token_for(make_user("pager", "operator"))
    body = {
        "alerts": [
            {
                "source": "zabbix",
                "labels": {"alertname": "FuelLeak", "stand": "105", "severity": "critical"},
                "annotations": {"description": STAND_FUEL_LEAK},
            },
            {"source": "agent:reasoning", "labels": {"alertname": "FuelLeak", "stand": "106"}},
            {"labels": {"alertname": "Unknown"}},
        ]
    }
    response = post("/ingest/alerts", body, token)
    assert response.status_code == 200
    outcomes = [(d["decision"], d["stage"]) for d in response.json()["decisions"]]
    assert outcomes == [("deliver", "policy"), ("drop", "loop"), ("sink", "match")]
    session = Session.objects.get()
    assert session.created_by.username == "pager"
    assert Observation.objects.get(stage="loop").session is None


@pytest.mark.services
def test_one_bad_alert_never_costs_its_group_the_delivery(
    gate_rules: GateRule, settings: Any
) -> None:
    """A group with an oversize annotation and an invalid alert beside a valid critical
    one is accepted: the long value is cut with a marker, the invalid alert recorded as
    refused with its reason, the critical one delivered."""
    settings.AERO_INGEST_SECRET = SECRET
    long = am_alert(stand="106", fingerprint="long", description="x" * 4_500)
    invalid = {**am_alert(stand="107", fingerprint="bad"), "status": "burning"}
    response = post("/ingest/alertmanager", v4("firing", invalid, long, am_alert()))
    assert response.status_code == 200
    decisions = response.json()["decisions"]
    assert [(d["decision"], d["stage"]) for d in decisions] == [
        ("refuse", "validate"),
        ("deliver", "policy"),
        ("deliver", "policy"),
    ]
    assert decisions[0]["reason"].startswith("alerts.0.status: Input should be 'firing'")
    refused = Observation.objects.get(decision="refuse")
    assert refused.labels["stand"] == "107" and refused.status == ""
    assert refused.annotations["description"] == STAND_FUEL_LEAK, "what it carried is kept"
    cut = Observation.objects.get(fingerprint="long").annotations["description"]
    assert len(cut) == MAX_LABEL_VALUE and cut.endswith(" …[cut: 4,500 characters]")
    assert Session.objects.count() == 1

    only_bad = post("/ingest/alertmanager", v4("firing", invalid, {**invalid, "labels": 5}))
    assert only_bad.status_code == 422 and only_bad.json()["code"] == "invalid_input"
    assert only_bad.json()["message"].startswith("alerts.0.status")
    reasons = [e["msg"] for e in only_bad.json()["errors"]]
    assert reasons[0].startswith("alerts.0.status") and reasons[1].startswith("alerts.1.")
    assert Observation.objects.filter(decision="refuse").count() == 3
    assert Observation.objects.filter(labels={"(as sent)": "5"}).exists()
    envelope = post("/ingest/alertmanager", {**v4("firing", am_alert()), "groupKey": None})
    assert envelope.status_code == 422 and envelope.json()["message"].startswith("groupKey")


@pytest.mark.services
@pytest.mark.parametrize(
    ("credential", "role", "status"),
    [(None, None, 401), ("wrong", None, 401), ("token", "auditor", 403), ("token", None, 403)],
)
def test_ingest_refuses_callers_without_a_valid_credential(
    gate_rules: GateRule,
    settings: Any,
    make_user: Callable[..., User],
    credential: str | None,
    role: str | None,
    status: int,
) -> None:
    settings.AERO_INGEST_SECRET = SECRET
    if credential == "token":
        credential = token_for(make_user("someone", *([role] if role else [])))
    for path, body in (
        ("/ingest/alertmanager", v4("firing", am_alert())),
        ("/ingest/alerts", {"alerts": [{"labels": {"alertname": "FuelLeak"}}]}),
    ):
        response = post(path, body, credential)
        assert response.status_code == status
        assert response.json()["code"] in ("unauthenticated", "forbidden")
    assert Observation.objects.count() == 0
    assert Client().get("/ingest/alertmanager").status_code == 405


@pytest.mark.services
def test_the_secret_is_off_when_unset_and_bad_payloads_get_json_errors(
    gate_rules: GateRule, settings: Any
) -> None:
    settings.AERO_INGEST_SECRET = ""
    assert post("/ingest/alertmanager", v4("firing", am_alert()), "").status_code == 401
    settings.AERO_INGEST_SECRET = SECRET
    wrong_version = post("/ingest/alertmanager", {**v4("firing", am_alert()), "version": "3"})
    assert wrong_version.status_code == 422
    assert wrong_version.json()["code"] == "invalid_input"
    assert "version" in wrong_version.json()["message"]
    not_json = Client().post(
        "/ingest/alerts",
        "{",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {SECRET}",
    )
    assert not_json.status_code == 400 and not_json.json()["code"] == "bad_json"
    assert Observation.objects.count() == 0
    nul = post("/ingest/alerts", {"alerts": [{"labels": {"alertname": "Fuel\u0000Leak"}}]})
    assert nul.status_code == 422 and "NUL" in nul.json()["message"]
    refused = Observation.objects.get()
    assert (refused.decision, refused.stage, refused.name) == (
        "refuse",
        "validate",
        "Fuel\ufffdLeak",
    )


@pytest.mark.services
def test_a_full_group_is_read_a_larger_one_or_a_bomb_gets_a_json_error(
    gate_rules: GateRule, settings: Any
) -> None:
    """A delivery over the site's upload limit but within the ingest's is read; one over
    the ingest's limit, a body nested past the parser's depth and a method the route does
    not take each get a JSON error, and nothing is observed."""
    settings.AERO_INGEST_SECRET = SECRET
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4_000
    settings.AERO_INGEST_MAX_BYTES = 20_000
    group = v4("firing", *(am_alert(fingerprint=f"f{n}") for n in range(12)))
    assert 4_000 < len(json.dumps(group)) < 20_000
    accepted = post("/ingest/alertmanager", group)
    assert accepted.status_code == 200 and accepted.json()["received"] == 12

    before = Observation.objects.count()
    too_large = post("/ingest/alertmanager", v4("firing", am_alert(), group="x" * 30_000))
    assert too_large.status_code == 413
    assert too_large.json()["code"] == "payload_too_large"
    assert "20,000 bytes" in too_large.json()["message"]
    bomb = Client().post(
        "/ingest/alerts",
        "[" * 9_000 + "]" * 9_000,  # deeper than the parser goes, within the size limit
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {SECRET}",
    )
    assert bomb.status_code == 400 and bomb.json()["code"] == "bad_json"
    deep = {"labels": {"alertname": "FuelLeak"}, "annotations": {}}
    nested: Any = "Fuel\u0000Leak"
    for _ in range(900):  # under the parser's depth, over what a recursive walk survives
        nested = [nested]
    deep["annotations"] = {"description": nested}
    nul = Client().post(
        "/ingest/alerts",
        json.dumps({"alerts": [deep]}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {SECRET}",
    )
    assert nul.status_code == 422 and "NUL" in nul.json()["message"]
    assert Observation.objects.filter(decision="refuse").count() == 1, "recorded as refused"
    before += 1
    wrong_method = Client().get("/ingest/alertmanager", HTTP_AUTHORIZATION=f"Bearer {SECRET}")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["code"] == "method_not_allowed" and wrong_method["Allow"] == "POST"
    assert Observation.objects.count() == before


@pytest.mark.services
def test_the_read_path_takes_no_lock(gate_rules: GateRule) -> None:
    first = provider.current()
    assert provider._reloading.acquire(timeout=1)  # a reload in progress elsewhere
    try:
        done = threading.Event()
        seen: list[Any] = []

        def read() -> None:
            seen.append(provider.current())
            done.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert done.wait(timeout=10), "a reader waited for the reload lock"
        reader.join()
        assert seen == [first]
    finally:
        provider._reloading.release()


@pytest.mark.services
def test_concurrent_deliveries_of_one_group_open_one_session(
    gate_rules: GateRule, settings: Any
) -> None:
    settings.AERO_INGEST_SECRET = SECRET
    barrier = threading.Barrier(3)
    results: list[Any] = []

    def deliver(fingerprint: str) -> None:
        try:
            barrier.wait(timeout=10)
            body = v4("firing", am_alert(fingerprint=fingerprint))
            results.append(post("/ingest/alertmanager", body).json()["decisions"][0])
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver, args=(f"fp{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert Session.objects.count() == 1
    assert {r["decision"] for r in results} == {"deliver"}
    assert {r["session_id"] for r in results} == {str(Session.objects.get().pk)}
    assert sum(r["reason"].endswith("opened a session") for r in results) == 1


@pytest.mark.services
def test_a_sunk_alert_costs_few_queries(
    gate_rules: GateRule, settings: Any, django_assert_max_num_queries: Any
) -> None:
    settings.AERO_INGEST_SECRET = SECRET
    body = {"alerts": [{"labels": {"alertname": "FuelLeak", "stand": "9", "severity": "warning"}}]}
    post("/ingest/alerts", {"alerts": [{"labels": {"alertname": "Warm-up"}}]})  # ingest user
    # the ingest user, the gate revision (once a second), the dedup lookup, the record
    with django_assert_max_num_queries(4):
        decision = post("/ingest/alerts", body).json()["decisions"][0]
    assert decision["decision"] == "sink"


@pytest.mark.services
def test_the_maintenance_loop_prunes_observations_past_their_retention(
    gate_rules: GateRule, settings: Any
) -> None:
    settings.AERO_INGEST_SECRET = SECRET
    settings.AERO_OBSERVATION_RETENTION_DAYS = 30
    for stand in ("1", "2", "3"):
        post("/ingest/alerts", {"alerts": [{"labels": {"alertname": "Disk", "stand": stand}}]})
    *old, kept = Observation.objects.order_by("id")
    Observation.objects.filter(pk__in=[o.pk for o in old]).update(
        received_at=timezone.now() - timedelta(days=31)
    )
    run_periodic_tasks()
    assert list(Observation.objects.all()) == [kept]
