"""What a reader reads is worded in their language from the logged facts (issue 34, item
3): the tower message, the report (worded when read, an old one as written), audit
details and a closed question's reason."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.utils import translation

from aero.audit_words import action_words, actor_words, detail_rows
from diagnosis.eventlog import registry
from diagnosis.models import Event, Session
from diagnosis.reporting import session_report
from diagnosis.wording import args_text
from packs.airport.tower import message_words
from scenarios_admin.models import Scenario
from tests.web_helpers import approve_everything, waiting_session

MESSAGE = "Apron fluid spill (FUEL) at 105, flight CA1234: risk HIGH (OS-01), isolate 105, A3, B"


@pytest.fixture
def oil_spill(builtin: None) -> dict[str, object]:
    scenario = Scenario.objects.get(slug="oil_spill")
    return scenario.versions.order_by("-number").first().definition  # type: ignore[union-attr]


def test_the_tower_message_reads_in_the_readers_words(oil_spill: dict[str, object]) -> None:
    with translation.override("zh-hans"):
        zh = message_words(MESSAGE, oil_spill)
    with translation.override("en"):
        en = message_words(MESSAGE, oil_spill)

    expected = "机坪漏油：泄漏液体为燃油、事发位置为105、航班号为CA1234；" + (
        "风险高（规则 OS-01）；隔离 105、A3、B"
    )
    assert zh == expected
    assert "FUEL" not in zh and "HIGH" not in zh
    assert en.startswith("Apron fuel spill: ") or "Fuel" in en
    assert "High (rule OS-01)" in en


def test_a_message_no_template_wrote_is_quoted_as_written(oil_spill: dict[str, object]) -> None:
    with translation.override("zh-hans"):
        assert message_words("Tower, fuel at 105", oil_spill) == "“Tower, fuel at 105”"


def test_the_action_card_words_the_message_and_the_tower_gets_the_template(
    builtin: None, alice: User
) -> None:
    session = waiting_session(alice)
    call = session.tool_calls.get(tool_name="notify_atc")
    # What the outbox sent: the scenario's own (English) text.
    assert call.request_payload["message"].startswith("Apron fluid spill (FUEL) at 105")
    definition = session.scenario_version.definition
    with translation.override("zh-hans"):
        words = args_text("notify_atc", call.request_payload, definition)
    assert words.startswith("通报内容=机坪漏油：") and "FUEL" not in words


@pytest.mark.services
def test_the_report_is_worded_in_each_readers_language_from_its_facts(
    builtin: None, alice: User, bob: User
) -> None:
    session = waiting_session(alice)
    approve_everything(session, bob)
    session.refresh_from_db()
    logged = Event.objects.get(session=session, type="report.ready").payload
    assert logged["language"] == "zh" and "facts" in logged

    zh = session_report(session, "zh") or ""
    en = session_report(session, "en") or ""
    assert zh == logged["markdown"]  # the session's language: the text as logged
    assert en.startswith("# Apron fluid spill response report")
    assert "Put the fire brigade on standby" in en and "request_fire_standby" not in en
    assert "消防待命" in zh and "request_fire_standby" not in zh
    assert "**高**" in zh and "**High**" in en


@pytest.mark.services
def test_a_report_logged_before_reports_kept_their_facts_reads_as_written(
    builtin: None, alice: User, bob: User
) -> None:
    session = waiting_session(alice)
    approve_everything(session, bob)
    event = Event.objects.get(session=session, type="report.ready")
    old = {k: v for k, v in event.payload.items() if k != "facts"}
    Event.objects.filter(pk=event.pk).update(payload={**old, "markdown": "# 旧报告\n"})
    session = Session.objects.get(pk=session.pk)

    assert session_report(session, "en") == "# 旧报告\n"


def test_audit_details_are_worded_and_codes_kept_for_tooltips() -> None:
    detail = {
        "tool": "close_taxiway",
        "args": {"taxiway": "A"},
        "reason": "approved from the desk",
        "digest": "ab12",
        "roles": ["operator", "approver"],
        "ok": True,
    }
    with translation.override("zh-hans"):
        rows = {row["key"]: row for row in detail_rows(detail)}

    assert rows["tool"]["value"] == "关闭滑行道" and rows["tool"]["label"] == "措施"
    assert rows["args"]["value"] == "滑行道=A"
    assert rows["reason"]["kind"] == "typed"  # a person's words: quoted as written
    assert rows["digest"]["kind"] == "data"  # logged data, shown as <code>
    assert rows["roles"]["value"] == "值班员、审批人"
    assert rows["ok"]["value"] == "是"


def test_a_closed_questions_reason_is_worded_in_the_log_summary() -> None:
    payload = {"question": "q1", "field": "leak_size", "reason": "unsure"}
    with translation.override("zh-hans"):
        text = registry.summary("agent.question_closed", payload)

    assert "尚不知道" in text and "unsure" not in text


def test_an_audit_entrys_action_and_the_systems_part_are_worded() -> None:
    # The page's language check skips dotted codes (approval.approved): this one does not.
    with translation.override("zh-hans"):
        assert action_words("approval.approved") == "已批准"
        assert action_words("session.closed") == "会话已结束"
        assert actor_words("system") == "系统"
        assert actor_words("alice") == "alice"  # a username is a name, shown as it is
        assert action_words("brand.new_action") == "brand.new_action"  # no words: its code
