"""A diagnosis session on the core's other surfaces: replay, the Markdown export, the
timeline page, the API snapshot, and the admin's pages of its scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.urls import reverse

from diagnosis.actions import do_delete_session
from diagnosis.models import Event, Session
from packs.diagnosis.sessions import start_from_bundle
from packs.diagnosis.storage import bundle_dir
from scenarios_admin.models import Scenario, ScenarioVersion
from tests.web_helpers import login

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


@pytest.fixture
def diagnosed(builtin: None, alice: User) -> Session:
    session = start_from_bundle(alice, EXAMPLES / "ex-deploy-payments.tar.gz", {})
    session.refresh_from_db()
    assert session.status == "waiting_user"
    return session


def test_replay_and_export(diagnosed: Session, alice: User, carol: User) -> None:
    client = login(carol)
    found = Event.objects.get(
        session=diagnosed, type="finding.recorded", payload__kind="root_cause"
    )
    replay = client.get(reverse("replay:replay-step", args=[diagnosed.pk]), {"seq": found.seq})
    assert replay.status_code == 200
    page = replay.content.decode()
    assert 'data-testid="root-cause-line" title="bad_deploy">a bad deploy<' in page
    # an operator's export (an auditor's masks the fix's arguments wherever they appear)
    export = login(alice).post(reverse("replay:replay-export", args=[diagnosed.pk]))
    assert export.status_code == 200, export.content.decode()[:500]
    markdown = export.content.decode()
    # the chronology words the diagnosis's findings and evidence calls
    assert "root cause bad_deploy on payments" in markdown
    assert "candidate bad_deploy on payments" in markdown


def test_timeline_page(diagnosed: Session, alice: User) -> None:
    page = login(alice).get(reverse("diagnosis:session-events", args=[diagnosed.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-testid="root-cause-line" title="bad_deploy">a bad deploy<' in text
    assert "Diagnosis requested from" in text


def test_admin_pages_of_the_diagnosis_scenario(builtin: None, make_user: Any) -> None:
    admin = make_user("root", "admin")
    admin.is_staff = admin.is_superuser = True
    admin.save()
    scenario = Scenario.objects.get(kind="diagnosis")
    client = login(admin)
    for name in ("change", "history"):
        url = reverse(f"admin:scenarios_admin_scenario_{name}", args=[scenario.pk])
        assert client.get(url).status_code == 200, url
    assert client.get(reverse("admin:scenarios_admin_scenario_changelist")).status_code == 200


def test_a_soft_delete_removes_the_stored_bundle(diagnosed: Session, make_user: Any) -> None:
    stored = bundle_dir(diagnosed.pk)
    assert (stored / "incident.yaml").is_file()
    admin = make_user("root", "admin")
    do_delete_session(diagnosed.pk, admin, "test data")
    assert not stored.exists()
    # the log keeps what the evidence said
    assert Event.objects.filter(session=diagnosed, type="tool.call_completed").exists()


def test_scenario_check_runs_the_example_bundles(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("scenario", "check", "it_diagnosis")
    out = capsys.readouterr().out
    assert "it_diagnosis v1: 3 example cases" in out
    assert "PASS 2: ex-pool-inventory: db_pool_exhausted on inventory" in out
    assert "3 passed, 0 failed" in out

    # A version whose pool threshold can never hold misses the pool example.
    scenario = Scenario.objects.get(slug="it_diagnosis")
    definition = scenario.latest_version().definition  # type: ignore[union-attr]
    definition["playbook"]["hypotheses"]["db_pool_exhausted"]["threshold"] = 2.0
    ScenarioVersion.objects.create(scenario=scenario, number=2, definition=definition)
    with pytest.raises(CommandError, match="1 of 3 example cases failed"):
        call_command("scenario", "check", "it_diagnosis", "--version", "2")
    out = capsys.readouterr().out
    assert "FAIL 2: ex-pool-inventory" in out
    assert "hypothesis: expected db_pool_exhausted" in out
