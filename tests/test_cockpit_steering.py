"""Issue 12, the operator steers: corrects an extracted fact (in the log, applied by the
agent, the rules run on it), adds a free-text update, closes a session with a summary.

Personas: alice operates, bob approves, carol audits."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import translation

from approvals.actions import do_decide, do_edit_args
from approvals.models import Approval
from diagnosis.actions import do_close
from diagnosis.models import Event, Report, Session
from diagnosis.wording import evidence_words
from replay.export import render_export
from tests.log_helpers import assert_projections_match
from tests.web_helpers import STAND_FUEL_LEAK, approval_for, login, make_session

pytestmark = pytest.mark.services

# The position is missing (the agent asks for it); the fluid was read as fuel.
FUEL_NO_POSITION = "CA1234 燃油泄漏，发动机运转，持续泄漏"


@pytest.fixture
def asking(builtin: None, alice: User) -> Session:
    session = make_session(alice, FUEL_NO_POSITION)
    assert session.snapshot["question"]["field"] == "position"
    return session


def post(user: User, name: str, session: Session, **data: str):  # type: ignore[no-untyped-def]
    return login(user).post(reverse(f"diagnosis:{name}", args=[session.pk]), data, follow=True)


def test_a_corrected_fact_is_logged_applied_and_the_rules_run_on_it(
    asking: Session, alice: User
) -> None:
    page = login(alice).get(reverse("diagnosis:session-detail", args=[asking.pk])).content.decode()
    assert 'data-testid="correct-fluid_type"' in page

    post(alice, "session-correct", asking, field="fluid_type", value="HYDRAULIC")
    asking.refresh_from_db()
    # Asked again for the position, plainly: the correction was no failed answer.
    assert asking.snapshot["question"]["field"] == "position"
    assert "未能识别" not in asking.snapshot["question"]["text"]
    assert Event.objects.filter(session=asking, type="user.message").last().payload["text"] == (  # type: ignore[union-attr]
        "泄漏液体: 液压油"
    )
    post(alice, "session-correct", asking, field="position", value="105")

    asking.refresh_from_db()
    assert asking.snapshot["fields"]["fluid_type"] == "HYDRAULIC"
    assert asking.snapshot["evidence"]["fluid_type"] == "corrected by alice"
    # The page words it in the reader's language (the log keeps the neutral form), not
    # as a quote of the operator.
    page = login(alice).get(reverse("diagnosis:session-detail", args=[asking.pk])).content.decode()
    assert '<span title="corrected by alice">corrected by alice</span>' in page
    assert "“corrected by alice”" not in page
    with translation.override("zh-hans"):
        assert evidence_words("corrected by alice") == "由 alice 更正"
        assert evidence_words("confirmed: 是") == "值班员已确认（“是”）"
        assert evidence_words("燃油泄漏") == ""  # the operator's words: quoted as they are
    message = Event.objects.filter(
        session=asking, type="user.message", payload__correction__isnull=False
    ).first()
    assert message is not None and message.payload["correction"] == {
        "field": "fluid_type",
        "value": "HYDRAULIC",
    }
    # With every fact known the rules ran on the corrected ones (hydraulic, not fuel).
    assert asking.snapshot["risk"]["rule"] != "OS-01"
    assert asking.snapshot["risk"]["when"].get("fluid_type") != "FUEL"
    assert_projections_match(asking)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("fluid_type", "WATER", "WATER is not one of this field&#x27;s values."),
        ("position", "999", "999 is not a stand, taxiway node or runway"),
        ("flight_no", "hello", "hello is not a flight number"),
        ("no_such", "x", "This scenario has no field no_such."),
        ("position", "", "Give the corrected value: it is empty."),
    ],
)
def test_a_bad_correction_is_refused_with_a_message_and_changes_nothing(
    asking: Session, alice: User, field: str, value: str, message: str
) -> None:
    before = asking.last_seq

    response = post(alice, "session-correct", asking, field=field, value=value)

    assert message in response.content.decode()
    asking.refresh_from_db()
    assert asking.last_seq == before


def test_a_correction_after_the_risk_is_assessed_re_runs_the_rules_and_the_proposals(
    builtin: None, alice: User, bob: User
) -> None:
    session = make_session(alice, STAND_FUEL_LEAK)  # fuel, engine running: OS-01, HIGH
    assert session.snapshot["risk"]["rule"] == "OS-01"
    fire = approval_for(session, "request_fire_standby")
    crew = approval_for(session, "dispatch_cleanup_crew")
    page = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk]))
    assert 'data-testid="correct-fluid_type"' in page.content.decode()

    response = post(alice, "session-correct", session, field="fluid_type", value="OIL")

    session.refresh_from_db()
    assert session.status == "waiting_user"
    assert session.snapshot["fields"]["fluid_type"] == "OIL"
    risk = session.snapshot["risk"]
    assert (risk["rule"], risk["level"]) == ("OS-09", "MEDIUM")
    assert risk["reassessed_from"]["rule"] == "OS-01" and risk["corrected"] == {"fluid_type": "OIL"}
    # Fire standby needs a HIGH risk: withdrawn, out of the queue, with its reason.
    fire.refresh_from_db()
    crew.refresh_from_db()
    assert fire.status == crew.status == "canceled"
    withdrawn = {
        e.payload["tool_name"]: e.payload["withdrawn"]
        for e in Event.objects.filter(session=session, type="approval.canceled")
    }
    assert withdrawn["request_fire_standby"] == "not_called_for"
    assert withdrawn["dispatch_cleanup_crew"] == "asked_again"
    open_now = {a.action_name: a for a in Approval.objects.filter(session=session).open()}
    assert "request_fire_standby" not in open_now and "suspend_stand_operations" not in open_now
    assert open_now["dispatch_cleanup_crew"].tool_call.call_id.endswith("#r1")
    # ATC was told "fuel, HIGH": it is told again, with the corrected facts.
    notices = list(session.tool_calls.filter(tool_name="notify_atc").order_by("pk"))
    assert [n.status for n in notices] == ["completed", "completed"]
    assert "FUEL" in notices[0].request_payload["message"]
    assert "(OIL)" in notices[1].request_payload["message"]
    assert "MEDIUM (OS-09)" in notices[1].request_payload["message"]
    html = response.content.decode()
    assert "Notify ATC again: the corrected facts change it" in html
    assert "Re-assessed after a correction (was High):" in html
    assert "withdrawn, the corrected facts no longer call for it" in html
    # The action table says withdrawn, not "canceled with the session": it is still open.
    rows = {
        name: html[html.index(f'id="action-{a.tool_call_id}"') :]
        for name, a in (("fire", fire), ("crew", crew))
    }
    rows = {name: row[: row.index("</tr>")] for name, row in rows.items()}
    assert all("Withdrawn after a correction" in row for row in rows.values())
    assert "the corrected facts no longer call for it" in rows["fire"]
    assert "asked again below for the corrected ones" in rows["crew"]
    assert not any("session ended" in row or "with the session" in row for row in rows.values())
    # The new request is decidable: its digests are those of the corrected facts.
    new_crew = open_now["dispatch_cleanup_crew"]
    do_decide(new_crew.pk, bob, "approve", "", digest=new_crew.digest)
    new_crew.refresh_from_db()
    assert new_crew.status == "approved"
    assert_projections_match(session)


def test_an_action_done_on_the_old_facts_is_proposed_again_only_when_they_change_it(
    builtin: None, alice: User, bob: User
) -> None:
    session = make_session(alice, STAND_FUEL_LEAK)  # stand 105
    crew = approval_for(session, "dispatch_cleanup_crew")
    do_decide(crew.pk, bob, "approve", "", digest=crew.digest)
    crew.refresh_from_db()
    assert crew.tool_call.status == "completed"  # the crew went to stand 105

    post(alice, "session-correct", session, field="position", value="102")

    session.refresh_from_db()
    # A crew for stand 102 is another action: it goes out once someone approves it.
    again = approval_for(session, "dispatch_cleanup_crew", position="102")
    assert again.status == "pending" and again.tool_call.call_id.endswith("#r1")
    # ATC, told of stand 105, hears of stand 102 at once (R0), and the timeline says why.
    notices = list(session.tool_calls.filter(tool_name="notify_atc").order_by("pk"))
    assert [n.status for n in notices] == ["completed", "completed"]
    assert " at 105," in notices[0].request_payload["message"]
    assert " at 102," in notices[1].request_payload["message"]
    notes = [
        e.payload
        for e in Event.objects.filter(session=session, type="agent.note")
        if e.payload.get("kind") == "proposed_again"
    ]
    assert [n["tool_name"] for n in notes] == ["notify_atc"]
    assert notes[0]["before"] == notices[0].request_payload
    assert notes[0]["args"] == notices[1].request_payload
    page = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk])).content
    assert "Notify ATC again: the corrected facts change it" in page.decode()
    markdown = render_export(session, alice, masked=False)
    assert (
        "notify_atc again, the corrected facts change it: message=Apron fluid spill (FUEL) at 105"
        in markdown
    )

    # A correction that changes none of their arguments sends nothing twice.
    post(alice, "session-correct", session, field="leak_size", value="SMALL")
    session.refresh_from_db()
    assert session.snapshot["fields"]["leak_size"] == "SMALL"
    assert session.snapshot["risk"]["rule"] == "OS-01"  # the same rule: the same message
    assert session.tool_calls.filter(tool_name="notify_atc").count() == 2
    # The crew that went to 105 is not sent again (the open request for 102 is withdrawn
    # and asked again, as every open request is after a correction).
    assert (
        session.tool_calls.filter(
            tool_name="dispatch_cleanup_crew", request_payload__position="105"
        ).count()
        == 1
    )
    assert_projections_match(session)


def test_an_approvers_edit_is_not_taken_for_a_change_of_the_facts(
    builtin: None, alice: User, bob: User
) -> None:
    session = make_session(alice, STAND_FUEL_LEAK)
    crew = approval_for(session, "dispatch_cleanup_crew")
    crew = do_edit_args(
        crew.pk, bob, {"position": "104"}, "the crew's truck is at 104", digest=crew.digest
    )
    do_decide(crew.pk, bob, "approve", "", digest=crew.digest)

    post(alice, "session-correct", session, field="leak_size", value="SMALL")

    # Proposed for 105 and edited to 104: the facts still say 105, so nothing is asked again.
    session.refresh_from_db()
    assert session.tool_calls.filter(tool_name="dispatch_cleanup_crew").count() == 1


def test_a_correction_while_the_agent_works_is_refused(builtin: None, alice: User) -> None:
    session = make_session(alice, STAND_FUEL_LEAK)
    Session.objects.filter(pk=session.pk).update(status="running")

    response = post(alice, "session-correct", session, field="fluid_type", value="OIL")

    assert "correct the fact once it waits" in response.content.decode()
    session.refresh_from_db()
    assert session.snapshot["fields"]["fluid_type"] == "FUEL"


def test_a_free_text_update_goes_into_the_log_and_the_timeline(
    asking: Session, alice: User
) -> None:
    response = post(alice, "session-update", asking, text="消防车已到场")

    event = Event.objects.get(session=asking, payload__kind="operator_update")
    assert event.payload == {"kind": "operator_update", "text": "消防车已到场", "by": "alice"}
    assert "消防车已到场" in response.content.decode()
    asking.refresh_from_db()
    assert asking.snapshot["question"]["field"] == "position"  # not taken as the answer
    empty = post(alice, "session-update", asking, text="  ")
    assert "Please type the update: it is empty." in empty.content.decode()


def test_closing_with_a_summary_is_a_normal_end_not_a_cancel(builtin: None, alice: User) -> None:
    session = make_session(alice, STAND_FUEL_LEAK)  # waits for approvals
    open_before = Approval.objects.filter(session=session).open().count()
    assert open_before

    response = post(alice, "session-close", session, summary="泄漏已由机务处理，无需进一步措施")

    session.refresh_from_db()
    assert session.status == "completed"
    assert not Event.objects.filter(session=session, type="session.canceled").exists()
    ended = Event.objects.get(session=session, type="session.completed").payload
    assert (ended["closed_by"], ended["summary"]) == ("alice", "泄漏已由机务处理，无需进一步措施")
    # Nobody can decide the open approvals any more: closed with the session, as a cancel.
    assert not Approval.objects.filter(session=session).open().exists()
    assert Event.objects.filter(session=session, type="approval.canceled").count() == open_before
    report = Report.objects.get(session=session).markdown
    # the session's language; the summary quoted as the operator typed it
    assert "**会话已由alice结束**，总结：“泄漏已由机务处理，无需进一步措施”" in report
    assert "已取消" not in report
    # The summary is the report's conclusion: its last section.
    assert report.rstrip().endswith(
        "## 结论\n\n“泄漏已由机务处理，无需进一步措施”\n\n（由alice结束会话）"
    )
    html = response.content.decode()
    assert "Closed by alice with a summary" in html and "Session canceled" not in html
    # Replay, history and the export say so too.
    replay = reverse("replay:replay-step", args=[session.pk])
    step = login(alice).get(replay, {"seq": session.last_seq}).content.decode()
    assert "closed by alice" in step and "泄漏已由机务处理" in step
    history = login(alice).get(reverse("replay:history")).content.decode()
    assert 'data-testid="closed-by">closed by alice' in history
    export = render_export(session, alice, masked=False)
    assert "| Closed | by alice with a summary: 泄漏已由机务处理，无需进一步措施 |" in export
    assert_projections_match(session)


def test_closing_needs_a_summary(asking: Session, alice: User) -> None:
    response = post(alice, "session-close", asking, summary="  ")

    assert "Please write a summary" in response.content.decode()
    asking.refresh_from_db()
    assert asking.status != "completed"


def test_cancel_stays_a_cancel(asking: Session, alice: User) -> None:
    post(alice, "session-cancel", asking, reason="wrong airport")

    asking.refresh_from_db()
    assert asking.status == "canceled"
    assert "wrong airport" in Report.objects.get(session=asking).markdown


@pytest.mark.parametrize("persona", ["bob", "carol"])
@pytest.mark.parametrize("name", ["session-update", "session-correct", "session-close"])
def test_approvers_and_auditors_cannot_steer(
    asking: Session, persona: str, name: str, request: pytest.FixtureRequest
) -> None:
    before = asking.last_seq

    response = login(request.getfixturevalue(persona)).post(
        reverse(f"diagnosis:{name}", args=[asking.pk]),
        {"text": "x", "field": "position", "value": "105", "summary": "x"},
    )

    assert response.status_code == 403
    asking.refresh_from_db()
    assert asking.last_seq == before


@pytest.mark.parametrize(
    ("text", "not_assessed", "no_actions"),
    [
        ("CA1234 在105机位燃油泄漏", "- 未评估：会话在评估风险之前结束", "| 无 | | | | |"),
        (
            "CA1234 fuel leak at stand 105",
            "- Not assessed: the session ended before the risk was assessed",
            "| none | | | | |",
        ),
    ],
)
def test_a_session_closed_before_the_risk_reports_it_plainly(
    builtin: None, alice: User, text: str, not_assessed: str, no_actions: str
) -> None:
    """Closed while the agent still asked: the report said "Risk level: ****, score
    (rule )" and "Radius:  hops from"; it says what was not done."""
    session = make_session(alice, text)
    assert session.snapshot["question"]  # still asking: no risk, no impact
    do_close(session.pk, session.created_by, "crew on scene, spill contained")

    report = Report.objects.get(session=session).markdown
    assert not_assessed in report and no_actions in report
    assert "crew on scene, spill contained" in report.rstrip().splitlines()[-3]
    assert "****" not in report and "()" not in report and "（规则 ）" not in report
