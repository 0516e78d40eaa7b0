"""`manage.py incident run`: the whole agent end to end, as a script user sees it."""

# Chinese incident reports use full-width punctuation on purpose.

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from approvals.models import Approval, ApprovalStatus
from diagnosis.models import Session
from packs.airport.models import Restriction
from tests import scenario_helpers
from tests.builtin_data import oil_spill
from tests.scenario_helpers import action_table

EXAMPLE_ONE = "CA1234 在105机位燃油泄漏，发动机仍在运转，还在持续漏"
EXAMPLE_TWO = "MU5678 stand 101 hydraulic leak, engines off, no longer leaking, about 2 m2"

pytestmark = pytest.mark.services


def run_incident(capsys: pytest.CaptureFixture[str], message: str, *options: str) -> dict[str, Any]:
    return scenario_helpers.run_incident(capsys, "oil_spill", message, *options)


def ask(field: str, language: str) -> str:
    return str(oil_spill()["fields"][field]["ask"][language])


def active_restrictions() -> set[tuple[str, str]]:
    return set(Restriction.objects.filter(lifted_at__isnull=True).values_list("kind", "target"))


# --- the worked examples ---------------------------------------------------------------


def test_example_one_approved(builtin: None, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_incident(capsys, EXAMPLE_ONE, "--decide", "approve")

    assert result["status"] == "completed"
    assert result["questions"] == []
    assert result["fields"] == {
        "flight_no": "CA1234",
        "position": "105",
        "fluid_type": "FUEL",
        "engine_status": "RUNNING",
        "continuous": True,
        "leak_size": "UNKNOWN",
    }
    assert result["risk"] == {"rule": "OS-01", "level": "HIGH", "score": 95}
    assert result["impact"] == {
        "radius": 3,
        "isolated_nodes": ["103", "104", "105", "106", "A1", "A2", "A3", "A4", "A5", "B1"],
        "taxiways": ["A", "B"],
        "runways": [],
        "stands": ["103", "104", "105", "106"],
        "flights": ["3U8888", "CA1234", "HU7601", "ZH9527"],
    }
    assert action_table(result) == [
        ("notify_atc", {}, "R0", "auto", "completed"),
        ("dispatch_cleanup_crew", {"position": "105"}, "R1", "approved", "completed"),
        ("request_fire_standby", {"position": "105"}, "R1", "approved", "completed"),
        ("suspend_stand_operations", {"stand": "105"}, "R2", "approved", "completed"),
        ("close_taxiway", {"taxiway": "A"}, "R2", "approved", "completed"),
        ("close_taxiway", {"taxiway": "B"}, "R2", "approved", "completed"),
    ]
    message = result["actions"][0]["args"]["message"]
    assert "CA1234" in message
    assert "OS-01" in message

    report = result["report_markdown"]
    assert report.startswith("# 机坪漏油应急处置报告")  # the operator wrote in Chinese
    assert "OS-01" in report
    assert "95" in report
    for flight in ("CA1234", "HU7601", "3U8888", "ZH9527"):
        assert flight in report
    assert "已批准" in report


def test_without_json_a_person_reads_a_summary_then_the_report(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    call_command("incident", "run", "--scenario", "oil_spill", "--message", EXAMPLE_ONE)

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("session ") and lines[0].endswith(": waiting_user")
    assert lines[1:8] == [  # fields in the scenario's order
        "  flight_no = CA1234",
        "  position = 105",
        "  fluid_type = FUEL",
        "  engine_status = RUNNING",
        "  continuous = True",
        "  leak_size = UNKNOWN",
        "  risk HIGH 95 (OS-01)",
    ]
    assert "  R0 notify_atc" in "\n".join(lines)
    assert any(line.endswith("-> pending/awaiting_approval") for line in lines)


def test_example_one_approved_closes_taxiways_and_suspends_the_stand(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(capsys, EXAMPLE_ONE, "--decide", "approve")

    assert active_restrictions() == {("taxiway", "A"), ("taxiway", "B"), ("stand", "105")}
    assert set(Restriction.objects.values_list("session_id", flat=True)) == {
        Session.objects.get(pk=result["session"]).pk
    }


def test_example_two_approved(builtin: None, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_incident(capsys, EXAMPLE_TWO, "--decide", "approve")

    assert result["status"] == "completed"
    assert result["fields"] == {
        "flight_no": "MU5678",
        "position": "101",
        "fluid_type": "HYDRAULIC",
        "engine_status": "STOPPED",
        "continuous": False,
        "leak_size": "MEDIUM",
    }
    assert result["risk"] == {"rule": "OS-12", "level": "LOW", "score": 25}
    assert result["impact"] == {
        "radius": 1,
        "isolated_nodes": ["101", "A1"],
        "taxiways": ["A"],
        "runways": [],
        "stands": ["101"],
        "flights": ["MU5678"],
    }
    assert action_table(result) == [
        ("notify_atc", {}, "R0", "auto", "completed"),
        ("dispatch_cleanup_crew", {"position": "101"}, "R1", "approved", "completed"),
        ("close_taxiway", {"taxiway": "A"}, "R2", "approved", "completed"),
    ]
    report = result["report_markdown"]
    assert report.startswith("# Apron fluid spill response report")
    assert "OS-12" in report
    assert "MU5678" in report
    assert active_restrictions() == {("taxiway", "A")}


def test_rejected_actions_close_nothing_and_the_report_is_still_written(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(
        capsys, EXAMPLE_ONE, "--decide", "reject", "--reason", "crew already on site"
    )

    assert result["status"] == "completed"
    assert action_table(result) == [
        ("notify_atc", {}, "R0", "auto", "completed"),
        ("dispatch_cleanup_crew", {"position": "105"}, "R1", "rejected", "rejected"),
        ("request_fire_standby", {"position": "105"}, "R1", "rejected", "rejected"),
        ("suspend_stand_operations", {"stand": "105"}, "R2", "rejected", "rejected"),
        ("close_taxiway", {"taxiway": "A"}, "R2", "rejected", "rejected"),
        ("close_taxiway", {"taxiway": "B"}, "R2", "rejected", "rejected"),
    ]
    assert not Restriction.objects.exists()
    report = result["report_markdown"]
    assert "OS-01" in report
    assert "已驳回" in report  # the word the pages use for a rejection
    assert "crew already on site" in report
    assert set(Approval.objects.values_list("status", flat=True)) == {ApprovalStatus.REJECTED}


def test_without_decisions_the_session_waits_for_approvers(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(capsys, EXAMPLE_ONE)

    assert result["status"] == "waiting_user"
    assert result["risk"] == {"rule": "OS-01", "level": "HIGH", "score": 95}
    assert action_table(result)[0] == ("notify_atc", {}, "R0", "auto", "completed")
    assert {(a["status"], a["decision"]) for a in result["actions"][1:]} == {
        ("awaiting_approval", "pending")
    }
    assert len(result["actions"]) == 6
    assert result["report_markdown"] == ""
    assert Approval.objects.filter(status=ApprovalStatus.PENDING).count() == 5
    assert not Restriction.objects.exists()


# --- asking the operator --------------------------------------------------------------


def test_missing_fields_are_asked_in_chinese_and_answers_used_in_order(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(
        capsys,
        "105机位漏油了",
        "--answer",
        "CA1234",
        "--answer",
        "燃油",
        "--answer",
        "已关车",
        "--answer",
        "是",
        "--decide",
        "approve",
    )

    assert result["questions"] == [
        ask("flight_no", "zh"),
        ask("fluid_type", "zh"),
        ask("engine_status", "zh"),
        ask("continuous", "zh"),
    ]
    assert result["fields"] == {
        "flight_no": "CA1234",
        "position": "105",
        "fluid_type": "FUEL",
        "engine_status": "STOPPED",
        "continuous": True,
        "leak_size": "UNKNOWN",
    }
    assert result["risk"] == {"rule": "OS-05", "level": "HIGH", "score": 80}
    assert result["status"] == "completed"
    assert "CA1234" in result["report_markdown"]


def test_when_answers_run_out_the_question_stays_open(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(capsys, "105机位漏油了", "--answer", "CA1234")

    assert result["status"] == "waiting_user"
    assert result["questions"] == [ask("flight_no", "zh"), ask("fluid_type", "zh")]
    assert result["fields"]["flight_no"] == "CA1234"
    assert result["risk"] is None
    assert result["actions"] == []
    assert Session.objects.get(pk=result["session"]).snapshot["question"]["field"] == "fluid_type"


def test_an_answer_not_understood_is_asked_again_with_a_hint(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(
        capsys,
        "105机位漏油了",
        "--answer",
        "CA1234",
        "--answer",
        "嗯",
        "--answer",
        "液压油",
        "--answer",
        "已关车",
        "--answer",
        "否",
        "--decide",
        "approve",
    )

    questions = result["questions"]
    assert questions[:2] == [ask("flight_no", "zh"), ask("fluid_type", "zh")]
    again = questions[2]
    assert again.startswith("未能识别您的回答")
    assert again.endswith(ask("fluid_type", "zh"))
    # The options in one stable order, whatever order the database kept the keys in.
    assert again == "未能识别您的回答。可选：燃油 / 液压油 / 滑油。" + ask("fluid_type", "zh")
    assert questions[3:] == [ask("engine_status", "zh"), ask("continuous", "zh")]
    assert result["fields"]["fluid_type"] == "HYDRAULIC"
    assert result["fields"]["continuous"] is False
    assert result["status"] == "completed"


def test_english_operators_are_asked_in_english(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(
        capsys,
        "hydraulic leak at stand 101",
        "--answer",
        "MU5678",
        "--answer",
        "hmm",
        "--answer",
        "engines off",
        "--answer",
        "no",
        "--decide",
        "approve",
    )

    assert result["questions"][:2] == [ask("flight_no", "en"), ask("engine_status", "en")]
    assert result["questions"][2].startswith("I could not recognise that answer.")
    assert result["questions"][2].endswith(ask("engine_status", "en"))
    assert result["questions"][3:] == [ask("continuous", "en")]
    assert result["risk"] == {"rule": "OS-12", "level": "LOW", "score": 25}
    assert result["status"] == "completed"
    assert result["report_markdown"].startswith("# Apron fluid spill response report")


# --- bad input ----------------------------------------------------------------------


def test_unknown_scenario(builtin: None) -> None:
    with pytest.raises(CommandError) as error:
        call_command("incident", "run", "--scenario", "volcano", "--message", EXAMPLE_ONE)
    message = str(error.value)
    assert "volcano" in message
    assert "oil_spill" in message  # says what exists
    assert "\n" not in message
    assert not Session.objects.exists()


@pytest.mark.parametrize("message", ["", "   "])
def test_empty_message(builtin: None, message: str) -> None:
    with pytest.raises(CommandError) as error:
        call_command("incident", "run", "--scenario", "oil_spill", "--message", message)
    assert "empty" in str(error.value)
    assert "\n" not in str(error.value)
    assert not Session.objects.exists()


def test_an_operator_who_does_not_know_is_told_why_it_is_needed(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(
        capsys,
        "CA1234 在105机位燃油泄漏",
        "--answer",
        "不知道，看不清",
        "--answer",
        "运转",
        "--answer",
        "否",
        "--decide",
        "approve",
    )

    questions = result["questions"]
    assert questions[0] == ask("engine_status", "zh")
    # Not "your answer was not understood": it was, and guessing is not an option.
    assert questions[1] == (
        "风险评估需要这一项：请向机组或现场人员确认后告诉我。可选：运转中 / 已关车。"
        + ask("engine_status", "zh")
        + "也可以在得知后，在“已知信息”中点击该项的“更正”填写。"
    )
    assert questions[2] == ask("continuous", "zh")  # plainly: that answer was read
    assert result["risk"]["rule"] == "OS-03"


def test_an_english_operator_who_does_not_know(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_incident(
        capsys,
        "MU5678 fuel leak at stand 101, engines off",
        "--answer",
        "I don't know yet",
        "--answer",
        "still leaking",
        "--decide",
        "approve",
    )

    assert result["questions"][0] == ask("continuous", "en")
    assert result["questions"][1] == (
        "The risk cannot be assessed without this: please check with the crew or the staff "
        "on site, then tell me. Options: Still leaking / Stopped. "
        + ask("continuous", "en")
        + " Or enter it with “Correct” under “What is known” when you know."
    )
    assert result["risk"]["rule"] == "OS-05"
