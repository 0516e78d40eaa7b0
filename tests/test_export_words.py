"""The reader's language, not the log's: the report's chronology words statuses,
compliance states, the agent's steps, model calls and what was appended (the codes
auditors match on stay), and an action's result is logged in English and shown in the
reader's language."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import translation

from approvals.actions import APPROVE, CONFIRM, do_decide
from approvals.models import Approval
from diagnosis.agent import summaries
from diagnosis.agent.tools import failure
from diagnosis.models import ToolCall
from diagnosis.reporting import result_words, worded_enrichment
from diagnosis.wording import failure_words, step_summary_words
from replay.export import summarize
from tests.web_helpers import STAND_FUEL_LEAK, approval_for, waiting_session

EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("session.status_changed", {"from": "running", "to": "waiting_user"}),
    ("fsm.transition", {"from": "FIELDS_COLLECTED", "to": "RISK_ASSESSED"}),
    ("agent.node_completed", {"node": "tool_executor", "summary": "3 call(s) handled"}),
    # A tool step that checked compliance itself (nodes.execution): both parts worded.
    (
        "agent.node_completed",
        {"node": "tool_executor", "summary": "5 call(s) handled; state IMPACT_ANALYZED"},
    ),
    (
        "llm.call",
        {
            "provider": "offline",
            "purpose": "react",
            "status": "ok",
            "tokens_in": 12,
            "tokens_out": 3,
        },
    ),
    ("approval.approved", {"tool_name": "close_taxiway", "risk_level": "R2", "by": "bob"}),
    ("timeline.appended", {"kind": "todo_resolved", "by": "bob", "title": "清理", "note": "完成"}),
]

ENGLISH = [
    "status Running → Waiting for people",
    "Facts collected → Risk assessed",
    "running tools 3 calls handled",
    "running tools 5 calls handled; compliance state: Impact analysed",
    "offline react ok, tokens in/out 12/3",
    "close_taxiway [R2] by bob",
    "to-do resolved bob 清理 完成",
]


def test_the_chronology_in_english() -> None:
    with translation.override("en"):
        assert [summarize(t, p) for t, p in EVENTS] == ENGLISH


@pytest.mark.parametrize(("event", "english"), list(zip(EVENTS, ENGLISH, strict=True)))
def test_the_chronology_in_chinese_has_no_english_words_of_its_own(
    event: tuple[str, dict[str, Any]], english: str
) -> None:
    with translation.override("zh-hans"):
        line = summarize(*event)
    assert line != english
    # What is left in Latin letters is the log's own: codes, names, providers.
    words = {w for w in "".join(c if c.isascii() and c.isalpha() else " " for c in line).split()}
    assert words <= {"close_taxiway", "R", "bob", "offline", "react", "ok", "close", "taxiway"}


@pytest.mark.services
def test_an_actions_result_is_logged_in_english_and_shown_in_the_readers_language(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    session = waiting_session(olga, STAND_FUEL_LEAK)
    crew = approval_for(session, "dispatch_cleanup_crew")
    closure = approval_for(session, "close_taxiway", taxiway="A")
    # The product's default language is zh-hans: the log still says it in English.
    with override_settings(LANGUAGE_CODE="zh-hans"), translation.override("zh-hans"):
        do_decide(crew.pk, abel, APPROVE, digest=crew.digest)
        do_decide(closure.pk, abel, APPROVE, digest=closure.digest)
        closure.refresh_from_db()
        do_decide(closure.pk, abel, CONFIRM, digest=closure.digest)
    crew.tool_call.refresh_from_db()
    closure.tool_call.refresh_from_db()
    assert crew.tool_call.response_payload["summary"] == "Cleanup crew dispatched (position 105)"
    assert closure.tool_call.response_payload["summary"] == "Taxiway closed: A"

    client = Client()
    client.force_login(olga)
    url = reverse("diagnosis:session-detail", args=[session.pk])
    english = client.get(url, HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "Cleanup crew dispatched (position 105)" in english and "Taxiway closed: A" in english
    with override_settings(LANGUAGE_CODE="zh-hans"):
        chinese = client.get(url, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    # In the actions table and on the timeline.
    assert chinese.count("已派遣清污人员 (位置 105)") == 2
    assert chinese.count("滑行道关闭: A") == 2
    assert "Cleanup crew dispatched" not in chinese and "Taxiway closed" not in chinese
    # The actions' arguments are labelled in words too.
    assert "位置=105" in chinese and "滑行道=A" in chinese and ">position=" not in chinese


@pytest.mark.parametrize(
    ("code", "params", "chinese"),
    [
        ("no_flight", {"flight": "XX999"}, "航班信息系统中没有航班 XX999"),
        ("no_flight_plan", {"flight": "XX999"}, "没有 XX999 的航班计划"),
        ("no_position", {"position": "999", "airport": "ZZAE"}, "999 不是 ZZAE 的位置"),
        ("timed_out", {"seconds": "2"}, "2 秒后超时"),
        ("no_topology", {}, "没有启用的机场拓扑"),
    ],
)
def test_a_lookups_failure_is_logged_in_english_and_read_in_chinese(
    code: str, params: dict[str, str], chinese: str
) -> None:
    logged = failure(code, **params)
    with translation.override("zh-hans"):
        assert failure(code, **params) == logged  # the log's language whatever the reader's
        assert failure_words(logged) == chinese
    with translation.override("en"):
        assert failure_words(logged) == logged
        assert failure_words("HTTP 503 from the flight information system") == (
            "HTTP 503 from the flight information system"  # not AERO's words: as logged
        )


@pytest.mark.services
def test_an_unknown_flight_reads_in_the_operators_language(
    whole_timeline_on_page: None, builtin: None, make_user: Callable[..., User]
) -> None:
    olga = make_user("olga", "operator")
    session = waiting_session(olga, "XX999 在105机位燃油泄漏，发动机仍在运转，还在持续漏")
    client = Client()
    client.force_login(olga)
    url = reverse("diagnosis:session-detail", args=[session.pk])
    with override_settings(LANGUAGE_CODE="zh-hans"):
        chinese = client.get(url, HTTP_ACCEPT_LANGUAGE="zh-hans").content.decode()
    # In the facts beside the timeline, on the timeline's lookup line and on the failed
    # call's own (internal) line.
    assert chinese.count("航班信息系统中没有航班 XX999") == 3
    assert chinese.count("没有 XX999 的航班计划") == 3
    assert "is not in the flight information system" not in chinese
    # The agent's internal steps (folded) read in Chinese too: what the nodes log is what
    # wording reads back.
    assert "已处理" in chinese and "合规状态：" in chinese and "识别到" in chinese
    shown = re.sub(r'title="[^"]*"', "", chinese)  # the logged text stays in tooltips
    for logged in ("call(s) handled", "field(s) recognised", ">state ", ">await<"):
        assert logged not in shown


@pytest.mark.parametrize(
    ("logged", "english", "chinese"),
    [
        ("6 field(s) recognised", "6 facts recognised", "识别到 6 项信息"),
        (
            "1 field(s) recognised, missing position",
            "1 fact recognised; missing: position",
            "识别到 1 项信息；缺少：position",
        ),
        (
            "2 call(s) handled, 1 refused",
            "2 calls handled; 1 refused",
            "已处理 2 个调用；1 个被拒绝",
        ),
        ("ask for engine_status", "asks for engine_status", "询问 engine_status"),
        # the tools by their words (the codes stay in the logged summary, the tooltip)
        (
            "call assess_risk, analyze_impact",
            "calls Assess the risk, Analyse the impact",
            "调用 评估风险、分析影响范围",
        ),
        ("state RISK_ASSESSED", "compliance state: Risk assessed", "合规状态：风险已评估"),
        ("await", "waits for decisions", "等待决定"),
        ("report written", "report written", "报告已生成"),
        ("stopped: budget refused", "stopped: budget refused", "stopped: budget refused"),
    ],
)
def test_the_agents_step_summaries_are_read_in_the_readers_language(
    logged: str, english: str, chinese: str
) -> None:
    with translation.override("en"):
        assert step_summary_words(logged) == english
    with translation.override("zh-hans"):
        assert step_summary_words(logged) == chinese


def test_the_report_gives_an_unavailable_sources_reason_in_its_language() -> None:
    logged = failure("no_flight_plan", flight="XX999")
    enrichment = {"degraded": [{"source": "lookup_flight_plan", "error": logged}]}
    chinese = worded_enrichment(enrichment, "zh")
    assert chinese["degraded"] == [
        {"source": "lookup_flight_plan", "error": "没有 XX999 的航班计划"}
    ]
    assert worded_enrichment(enrichment, "en") == enrichment
    assert enrichment["degraded"][0]["error"] == logged  # the state itself is not touched


def test_the_reports_action_table_gives_results_in_its_language() -> None:
    """Reports are written in the session's scenario language ("zh"/"en"): a bare "zh"
    has no catalogue of its own, and the results used to come out in English."""
    closure = ToolCall(
        tool_name="close_taxiway",
        request_payload={"taxiway": "A"},
        response_payload={
            "summary": "Taxiway closed: A",
            "restriction": {"kind": "taxiway", "target": "A"},
        },
    )
    crew = ToolCall(
        tool_name="dispatch_cleanup_crew",
        request_payload={"position": "105"},
        response_payload={"summary": "Cleanup crew dispatched (position 105)"},
    )
    assert [result_words(c, "zh") for c in (closure, crew)] == [
        "滑行道关闭: A",
        "已派遣清污人员 (位置 105)",
    ]
    assert [result_words(c, "en") for c in (closure, crew)] == [
        "Taxiway closed: A",
        "Cleanup crew dispatched (position 105)",
    ]


def test_every_step_summary_the_agent_logs_is_read_back() -> None:
    """What the agent nodes log (diagnosis.agent.summaries) is what wording reads: none comes
    out as logged in Chinese."""
    logged = [
        summaries.fields_recognised(2, ["position"]),
        summaries.fields_recognised(6, []),
        summaries.calls_handled(3, 1),
        summaries.calls_handled(1, 0),
        summaries.asks_for("position"),
        summaries.calls(["assess_risk", "analyze_impact"]),
        summaries.compliance_state("DECIDED"),
        summaries.REPORT_WRITTEN,
    ]
    with translation.override("zh-hans"):
        assert [step_summary_words(text) == text for text in logged] == [False] * len(logged)


@pytest.mark.services
def test_a_chinese_report_gives_an_unavailable_sources_reason_in_chinese(
    builtin: None, make_user: Callable[..., User]
) -> None:
    olga, abel, eve = (
        make_user("olga", "operator"),
        make_user("abel", "approver"),
        make_user("eve", "approver"),
    )
    session = waiting_session(olga, "XX999 在105机位燃油泄漏，发动机仍在运转，还在持续漏")
    for item in Approval.objects.filter(session=session).open():
        while item.is_open:
            confirming = item.status == "confirming"
            item = do_decide(
                item.pk,
                eve if confirming else abel,
                CONFIRM if confirming else APPROVE,
                digest=item.digest,
            )
    session.refresh_from_db()
    assert session.status == "completed"
    assert "没有 XX999 的航班计划" in session.report.markdown
    assert "no flight plan for" not in session.report.markdown
