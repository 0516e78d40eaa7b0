"""Issue 32, item 6: a fact corrected after the risk was assessed. The agent re-reads the
lookups, re-assesses and re-proposes; open approvals for actions the new facts no longer
call for are withdrawn (event, reason); approved ones stay as history; the report tells
both. A change typed as an answer (confirmed) counts like the correction form.

Personas: alice operates, bob approves."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User

from approvals.actions import do_decide
from approvals.models import Approval
from diagnosis.actions import do_answer, do_correct_fact, do_create_session
from diagnosis.models import Event, Session
from diagnosis.reporting import session_report
from scenarios_admin.models import Scenario
from tests.web_helpers import STAND_FUEL_LEAK, approval_for, approve_everything, make_session

pytestmark = pytest.mark.services


def corrected_then_decided(alice: User, bob: User, message: str) -> Session:
    """Fuel, engine running at stand 105 (OS-01, HIGH); the fire standby is approved and
    done; then the fluid is corrected to engine oil (OS-09, MEDIUM) and the rest decided."""
    session = make_session(alice, message)
    assert session.snapshot["risk"]["rule"] == "OS-01"
    fire = approval_for(session, "request_fire_standby")
    do_decide(fire.pk, bob, "approve", "", digest=fire.digest)

    do_correct_fact(session.pk, alice, "fluid_type", "OIL")
    session.refresh_from_db()
    assert session.snapshot["risk"]["rule"] == "OS-09"
    approve_everything(session, bob)
    session.refresh_from_db()
    assert session.status == "completed"
    return session


def test_the_report_tells_what_was_withdrawn_and_what_stays_history(
    builtin: None, alice: User, bob: User
) -> None:
    session = corrected_then_decided(alice, bob, STAND_FUEL_LEAK)

    fire = session.tool_calls.get(tool_name="request_fire_standby")
    assert fire.status == "completed"  # approved before the correction: history
    withdrawn = {
        (e.payload["tool_name"], e.payload["args"].get("taxiway") or e.payload["args"].get("stand"))
        for e in Event.objects.filter(session=session, type="approval.canceled")
        if e.payload["withdrawn"] == "not_called_for"
    }
    assert withdrawn == {("suspend_stand_operations", "105"), ("close_taxiway", "B")}
    report = session.report.markdown
    section = report[report.index("## 风险评估后变更的事实") :]
    assert (
        "- 更正（泄漏液体 → 滑油）：风险由 高（规则 OS-01） 重新评估为 中（规则 OS-09）" in section
    )
    assert (
        "- 决定前已撤回（新的事实不再需要）：暂停机位作业 (机位=105)、关闭滑行道 (滑行道=B)。"
        in section
    )
    assert (
        "- 按先前事实已批准，保留为历史记录（新的事实不再需要）：消防待命 (位置=105)。" in section
    )
    # The action table words each withdrawal in the report's language.
    assert "未决关闭: 更正后的事实不再需要，已撤回" in report
    assert "no longer called for" not in report
    # Read in English, the same facts in English words (worded at read time).
    english = session_report(session, "en") or ""
    assert "- Corrected (Fluid type → Engine oil): re-assessed from High (rule OS-01)" in english
    assert "更正" not in english


def test_an_english_report_tells_the_same(builtin: None, alice: User, bob: User) -> None:
    session = corrected_then_decided(
        alice, bob, "CA1234 fuel leak at stand 105, engine running, still leaking"
    )

    report = session.report.markdown
    assert "## Facts changed after the risk was assessed" in report
    assert (
        "- Corrected (Fluid type → Engine oil): re-assessed from High (rule OS-01) to Medium"
        in report
    )
    assert "Withdrawn before a decision, the new facts no longer call for them: " in report
    assert (
        "kept as history (the new facts no longer call for them): Put the fire brigade on standby"
        in report
    )


def test_no_correction_no_section(builtin: None, alice: User, bob: User) -> None:
    session = make_session(alice)
    approve_everything(session, bob)
    session.refresh_from_db()
    assert "风险评估后变更的事实" not in session.report.markdown


def test_a_change_typed_as_an_answer_after_the_risk_re_assesses_and_re_proposes(
    builtin: None, alice: User, bob: User
) -> None:
    session = do_create_session(
        alice, Scenario.objects.get(slug="tire_burst"), "3U8888 在滑行道B2滑行时爆胎，地面有碎片"
    )
    session.refresh_from_db()
    assert session.snapshot["risk"]["rule"] == "TB-04"
    old = {a.pk for a in Approval.objects.filter(session=session).open()}

    do_answer(session.pk, alice, "不对，是在滑行道B3")
    session.refresh_from_db()
    question = session.snapshot["question"]
    assert question["field"] == "position" and "B3" in question["text"]  # confirmed first
    do_answer(session.pk, alice, "是")
    session.refresh_from_db()

    assert session.snapshot["fields"]["position"] == "B3"
    risk = session.snapshot["risk"]
    assert risk["reassessed_from"]["rule"] == "TB-04" and risk["corrected"] == {"position": "B3"}
    # The lookups ran again for the new position, and the open approvals were withdrawn.
    assert session.snapshot["enrichment"]["stand_location"]["node_id"] == "B3"
    assert not (old & {a.pk for a in Approval.objects.filter(session=session).open()})
    assert Event.objects.filter(session=session, type="approval.canceled").count() == len(old)
