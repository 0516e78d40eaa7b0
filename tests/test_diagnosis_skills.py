"""Uploaded skills in an IT diagnosis: an active R0 skill that applies to the incident's
problem type is called like every evidence tool (tool.call_started and completed, its
arguments from the incident checked against its manifest), and its finding shows on the
session page, in the export's evidence chain and in replay. A skill that misbehaves
fails its call with the reason and the diagnosis concludes as without it; a skill of
another problem type, or of risk R1, is not called."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import override_settings
from django.urls import reverse

from diagnosis.actions import do_retry
from diagnosis.agent import slow_tools
from diagnosis.agent.nodes import waiting
from diagnosis.models import Event, LLMRequest, Session, ToolCall
from packs.diagnosis.sessions import start_from_bundle
from packs.diagnosis.skill_calls import SKILL_RUN, skill_calls
from tests.skill_helpers import COUNT_ERRORS, skill_zip
from tests.web_helpers import login
from tools.skills import save_upload

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
TOOL = "skill:count-errors"
FAST = {"timeout_seconds": 30, "cpu_seconds": 1, "memory_mb": 128}

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


@pytest.fixture
def root(db: None) -> User:
    return User.objects.create_superuser("root", password="pw-for-tests")


def diagnose(alice: User, example: str, mode: str = "") -> Session:
    options = {"preferred_mode": mode} if mode else {}
    session = start_from_bundle(alice, EXAMPLES / f"{example}.tar.gz", options)
    session.refresh_from_db()
    assert session.status == "waiting_user"
    return session


def cause_of(session: Session) -> dict[str, Any]:
    found = Event.objects.get(session=session, type="finding.recorded", payload__kind="root_cause")
    return dict(found.payload)


def test_an_active_skill_is_an_evidence_call_shown_exported_and_replayed(
    builtin: None, alice: User, root: User
) -> None:
    save_upload(skill_zip(COUNT_ERRORS, applies_to=["error_spike"], limits=FAST), root)
    save_upload(
        skill_zip("raise SystemExit(1)", name="other-type", applies_to=["service_down"]), root
    )
    save_upload(skill_zip(COUNT_ERRORS, name="risky", applies_to=["error_spike"], risk="R1"), root)
    session = diagnose(alice, "ex-deploy-payments")

    call = ToolCall.objects.get(session=session, tool_name=TOOL)
    assert call.status == "completed" and call.risk_class == "R0"
    assert call.request_payload == {
        "problem_type": "error_spike",
        "services": call.request_payload["services"],
    }
    lines = call.response_payload["result"]["lines"]
    assert lines > 0
    summary = f"count-errors 1.0: {lines} ERROR lines (error_spike)"
    assert call.response_payload["summary"] == summary
    types = list(
        Event.objects.filter(session=session, payload__tool_name=TOOL)
        .order_by("seq")
        .values_list("type", flat=True)
    )
    assert types == ["tool.call_started", "tool.call_completed"]
    # The skill for another problem type is not called; the R1 skill is not run as
    # evidence: it waits for its approval, unrun.
    assert not ToolCall.objects.filter(session=session, tool_name="skill:other-type").exists()
    risky = ToolCall.objects.get(session=session, tool_name="skill:risky")
    assert risky.status == "awaiting_approval" and not risky.response_payload
    assert cause_of(session)["hypothesis"] == "bad_deploy"  # the reading is the playbook's

    client = login(alice)
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert f'data-tool="{TOOL}"' in page and summary in page
    markdown = client.post(reverse("replay:replay-export", args=[session.pk])).content.decode()
    assert f"| {TOOL} | R0 |" in markdown and f"{lines} ERROR lines" in markdown
    done = Event.objects.get(session=session, type="tool.call_completed", payload__tool_name=TOOL)
    replay = client.get(reverse("replay:replay-step", args=[session.pk]), {"seq": done.seq})
    assert summary in replay.content.decode()


def test_a_misbehaving_skill_fails_its_call_and_the_diagnosis_goes_on(
    builtin: None, alice: User, root: User
) -> None:
    looping = skill_zip("while True:\n    pass\n", applies_to=["slow_response"], limits=FAST)
    save_upload(looping, root)
    session = diagnose(alice, "ex-pool-inventory", mode="hierarchical")

    failed = Event.objects.get(session=session, type="tool.call_failed", payload__tool_name=TOOL)
    assert failed.payload["error"] == "skill count-errors: stopped at its CPU limit (1 s)"
    assert cause_of(session)["hypothesis"] == "db_pool_exhausted"
    page = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk]))
    assert "Failed: skill count-errors: stopped at its CPU limit (1 s)" in page.content.decode()


def test_offering_the_skills_costs_one_query_whatever_their_number(
    root: User, django_assert_num_queries: Any
) -> None:
    for name in ("a-skill", "b-skill", "c-skill"):
        save_upload(skill_zip(COUNT_ERRORS, name=name, applies_to=["error_spike"]), root)
    found = SimpleNamespace(
        problem_type="error_spike", candidates=["payments"], related_services=[], service=None
    )
    window = {"since": "2026-01-01T00:00:00", "until": "2026-01-01T01:00:00"}
    with django_assert_num_queries(1):
        calls = skill_calls(found, window)  # type: ignore[arg-type]
    assert [(c["call_id"], c["tool"]) for c in calls] == [
        ("ev-skill-a-skill", "skill:a-skill"),
        ("ev-skill-b-skill", "skill:b-skill"),
        ("ev-skill-c-skill", "skill:c-skill"),
    ]
    assert calls[0]["args"] == {"problem_type": "error_spike", "services": ["payments"]}


def test_a_step_run_again_after_a_crash_does_not_run_the_skill_twice(
    builtin: None, alice: User, root: User, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """The worker dies after the evidence steps committed and before their checkpoint;
    the retry runs the steps again: the skill's call is reused (one row, one started and
    one completed event), never run again."""
    save_upload(skill_zip(COUNT_ERRORS, applies_to=["error_spike"], limits=FAST), root)
    original = waiting.wait_for_user
    crashes = {"left": settings.AERO_JOB_ATTEMPTS}

    def crash_before_the_wait(*args: Any) -> Any:
        if crashes["left"]:
            crashes["left"] -= 1
            raise RuntimeError("worker lost its database connection")
        return original(*args)

    monkeypatch.setattr(waiting, "wait_for_user", crash_before_the_wait)
    session = start_from_bundle(alice, EXAMPLES / "ex-deploy-payments.tar.gz", {})
    session.refresh_from_db()
    assert session.status == "failed"
    with connection.cursor() as cursor:  # as if the process died before its checkpoint
        for table in ("checkpoint_writes", "checkpoint_blobs", "checkpoints"):
            cursor.execute(f"DELETE FROM {table} WHERE thread_id = %s", [str(session.pk)])
    do_retry(session.pk, alice)
    session.refresh_from_db()
    assert session.status == "waiting_user"
    assert ToolCall.objects.filter(session=session, tool_name=TOOL).count() == 1
    logged = Event.objects.filter(session=session, payload__tool_name=TOOL)
    assert sorted(logged.values_list("type", flat=True)) == [
        "tool.call_completed",
        "tool.call_started",
    ]


def test_with_waits_a_skill_runs_outside_the_job_as_a_slow_tool(
    builtin: None, alice: User, root: User, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job ends at the skill's call; the LLM runner runs the skill, with no job
    holding the session, and the session resumes with its result."""
    settings.AERO_LLM_WAITS = True
    save_upload(skill_zip(COUNT_ERRORS, applies_to=["error_spike"], limits=FAST), root)
    real = slow_tools.slow_tool(SKILL_RUN)
    leases: list[Any] = []

    def watched(args: dict[str, Any]) -> dict[str, Any]:
        waiting_on = Session.objects.filter(llm_requests__purpose=f"tool:{SKILL_RUN}")
        leases.append(waiting_on.values_list("lease_token", flat=True).get())
        return real.run(args)

    monkeypatch.setitem(
        slow_tools._TOOLS, SKILL_RUN, slow_tools.SlowTool(real.name, watched, real.timeout)
    )
    session = diagnose(alice, "ex-deploy-payments")

    assert leases == [None]  # run once, by the runner, while no job held the session
    (request,) = LLMRequest.objects.filter(session=session, purpose=f"tool:{SKILL_RUN}")
    assert request.status == "done"
    call = ToolCall.objects.get(session=session, tool_name=TOOL)
    assert call.status == "completed" and call.response_payload["result"]["lines"] > 0
    (outcome,) = Event.objects.filter(
        session=session, type="tool.slow_call", payload__tool=SKILL_RUN
    )
    assert outcome.payload["status"] == "ok"
    assert cause_of(session)["hypothesis"] == "bad_deploy"


def _skill_approval(session: Session, tool: str) -> Any:
    from approvals.models import Approval

    return Approval.objects.get(session=session, tool_call__tool_name=tool)


def test_an_r1_skill_waits_for_approval_then_runs_as_evidence(
    builtin: None, alice: User, bob: User, root: User
) -> None:
    """A skill whose manifest raises its risk class is proposed after the conclusion: an
    approval card naming the skill, its version and its arguments; nothing runs before
    the decision, nothing leaves AERO on approval; approved, it runs and its finding is
    evidence; then the fix is proposed as usual."""
    from approvals.actions import do_decide
    from diagnosis.models import Outbox

    save_upload(
        skill_zip(COUNT_ERRORS, name="risky", applies_to=["error_spike"], risk="R1", limits=FAST),
        root,
    )
    session = diagnose(alice, "ex-deploy-payments")
    call = ToolCall.objects.get(session=session, tool_name="skill:risky")
    assert call.status == "awaiting_approval" and call.risk_class == "R1"
    assert call.request_payload == {
        "version": "1.0",
        "arguments": {
            "problem_type": "error_spike",
            "services": call.request_payload["arguments"]["services"],
        },
    }
    assert not ToolCall.objects.filter(session=session, call_id="fix-1").exists()
    approval = _skill_approval(session, "skill:risky")
    card = login(bob).get(reverse("approvals:queue")).content.decode()
    assert "skill:risky" in card and "1.0" in card and "error_spike" in card

    do_decide(approval.pk, bob, "approve", "read the logs", digest=approval.digest)
    session.refresh_from_db()
    call.refresh_from_db()
    assert call.status == "completed" and call.response_payload["result"]["lines"] > 0
    assert not Outbox.objects.filter(tool_call=call).exists()
    types = list(
        Event.objects.filter(session=session, payload__tool_name="skill:risky")
        .order_by("seq")
        .values_list("type", flat=True)
    )
    assert types == [
        "approval.required",
        "approval.approved",
        "tool.call_started",
        "tool.call_completed",
    ], types
    assert session.status == "waiting_user"  # now on the fix's approval
    assert ToolCall.objects.get(session=session, call_id="fix-1").status == "awaiting_approval"
    assert cause_of(session)["hypothesis"] == "bad_deploy"


def test_a_rejected_r1_skill_does_not_run_and_the_session_says_so(
    builtin: None, alice: User, bob: User, root: User
) -> None:
    from approvals.actions import do_decide

    save_upload(
        skill_zip(
            "raise SystemExit('must not run')",
            name="risky",
            applies_to=["error_spike"],
            risk="R2",
            limits=FAST,
        ),
        root,
    )
    session = diagnose(alice, "ex-deploy-payments")
    approval = _skill_approval(session, "skill:risky")
    assert approval.risk_class == "R2"
    do_decide(approval.pk, bob, "reject", "not on production", digest=approval.digest)
    session.refresh_from_db()
    call = ToolCall.objects.get(session=session, tool_name="skill:risky")
    assert call.status == "rejected"
    assert not Event.objects.filter(
        session=session, type="tool.call_started", payload__tool_name="skill:risky"
    ).exists()
    (note,) = Event.objects.filter(
        session=session, type="agent.note", payload__kind="skill_not_run"
    )
    assert note.payload["text"] == "skill:risky 1.0 not run: rejected by bob (not on production)"
    page = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk]))
    assert "Continuing without" in page.content.decode()
    assert "(rejected: not on production)" in page.content.decode()
    # the session goes on without it: the fix is proposed
    assert session.status == "waiting_user"
    assert ToolCall.objects.get(session=session, call_id="fix-1").status == "awaiting_approval"


def test_every_misbehaviour_fails_only_its_own_call_with_a_clear_event(
    builtin: None, alice: User, root: User, tmp_path: Path
) -> None:
    """Five misbehaving skills in one diagnosis: each call fails with a `tool.call_failed`
    naming what it did; the stored bundle is untouched, nobody is reached on the network,
    the other calls and the conclusion are as without them."""
    import socket

    from packs.diagnosis.storage import bundle_dir

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    bad = {
        "loops": ("while True:\n    pass\n", ("stopped at its CPU limit (1 s)",)),
        "hoards": (
            "hoard = []\nwhile True:\n    hoard.append(bytearray(10**7))\n",
            ("out of its memory (128 MB)",),
        ),
        "plants": ("open('/bundle/planted.txt', 'w').write('never')\n", ("Read-only file system",)),
        "dials": (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=5)\n",
            # its own network namespace: no route out, or a loopback of its own
            ("Network is unreachable", "Connection refused"),
        ),
        "babbles": ("print('hello, not json')\n", ("not JSON",)),
    }
    for name, (script, _) in bad.items():
        save_upload(skill_zip(script, name=name, applies_to=["slow_response"], limits=FAST), root)
    try:
        session = diagnose(alice, "ex-pool-inventory")
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody came
    finally:
        listener.close()
    for name, (_, words) in bad.items():
        (failed,) = Event.objects.filter(
            session=session, type="tool.call_failed", payload__tool_name=f"skill:{name}"
        )
        assert failed.payload["error"].startswith(f"skill {name}: "), failed.payload
        assert any(w in failed.payload["error"] for w in words), (name, failed.payload)
    assert not (bundle_dir(session.pk) / "planted.txt").exists()
    others = ToolCall.objects.filter(session=session, call_id__startswith="ev-").exclude(
        tool_name__startswith="skill:"
    )
    assert set(others.values_list("status", flat=True)) == {"completed"}
    assert cause_of(session)["hypothesis"] == "db_pool_exhausted"
