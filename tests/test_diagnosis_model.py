"""With a model (issue 35 item 6): a scripted model (the simulated provider over HTTP)
chooses the evidence calls and words the conclusion of an IT diagnosis in ReAct and
plan-execute; the playbook bounds what it may conclude (a root cause outside its
findings, or ranked below its first, is corrected), every conclusion cites this
session's tool results (a foreign id is dropped, a conclusion citing none is corrected:
a violation on the timeline either way, never reported), and a model that fails leaves
the offline path, which concludes exactly as expected.yaml. Every test runs with the
model's calls made in the job and as waits the LLM runner answers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import reverse

from approvals.actions import APPROVE, CONFIRM, do_decide
from approvals.models import OPEN_STATUSES, Approval, ApprovalStatus
from diagnosis.agent.fake_llm import FakeLLMServer
from diagnosis.agent_tree import AgentTree, read_tree
from diagnosis.llm_runner.records import PRODUCER
from diagnosis.models import Event, Session, ToolCall
from packs.diagnosis.sessions import start_from_bundle, summarize
from tests.llm_helpers import fake_llm, fake_provider
from tests.test_diagnosis_sessions import EXPECTED, SPEC
from tests.web_helpers import login

__all__ = ["fake_llm"]  # the fixture

pytestmark = pytest.mark.services

BUNDLE = SPEC / "ex-deploy-payments.tar.gz"
WORDS = "The payments deploy D-5716 broke the checkout handler."


@pytest.fixture(autouse=True, params=[False, True], ids=["calls-in-the-job", "calls-as-waits"])
def model_calls(request: pytest.FixtureRequest, settings: Any) -> bool:
    settings.AERO_LLM_WAITS = request.param
    return bool(request.param)


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


@pytest.fixture
def chief(make_user: Callable[..., User]) -> User:
    """Starts the sessions and decides their fixes, as the command's user does."""
    return make_user("chief", "operator", "approver")


def run_bundle(mode: str, user: User) -> dict[str, Any]:
    """The example bundle as a session in `mode`, every fix approved (the command's
    --decide approve; the command itself makes its model calls in the job only)."""
    session = start_from_bundle(user, BUNDLE, {"producer": "t", "preferred_mode": mode})
    for _ in range(4):
        pending = list(Approval.objects.filter(session=session, status__in=OPEN_STATUSES))
        for approval in pending:
            while approval.is_open:
                step = CONFIRM if approval.status == ApprovalStatus.CONFIRMING else APPROVE
                approval = do_decide(
                    approval.pk, user, step, "approved", digest=approval.digest, producer="t"
                )
    session.refresh_from_db()
    return summarize(session)


def payloads(session: str, kind: str) -> list[dict[str, Any]]:
    return [e.payload for e in Event.objects.filter(session_id=session, type=kind).order_by("seq")]


def evidence_calls(session: str) -> list[str]:
    return list(
        ToolCall.objects.filter(session_id=session, is_action=False)
        .order_by("id")
        .values_list("call_id", flat=True)
    )


def root_cause(session: str) -> dict[str, Any]:
    (found,) = [p for p in payloads(session, "finding.recorded") if p["kind"] == "root_cause"]
    return found


def conclusion(**said: Any) -> dict[str, Any]:
    """The model's conclusion (the call without tools)."""
    return {"match": {"has_tools": False}, "json": said}


LOG_SEARCH = {"service": "payments", "level": "ERROR", "limit": 5}
REACT_RULES = [
    {
        "match": {"has_tools": True, "after_tool": "deploys"},
        "content": "A deploy of payments in the window; its errors next.",
        "tool_calls": [{"name": "log_search", "arguments": LOG_SEARCH}],
    },
    {
        "match": {"has_tools": True, "after_tool": "log_search"},
        "tool_calls": [{"name": "log_signatures", "arguments": {}}],
    },
    {
        "match": {"has_tools": True, "after_tool": "log_signatures"},
        "tool_calls": [{"name": "anomalies", "arguments": {}}],
    },
    {"match": {"has_tools": True, "after_tool": "anomalies"}, "content": "Enough evidence."},
    {
        "match": {"has_tools": True},
        "content": "The changes first.",
        "tool_calls": [{"name": "deploys", "arguments": {}}],
    },
]
PLAN_RULE = {
    "match": {"has_tools": True},
    "content": "Read the deploys and the logs, and the payments errors.",
    "tool_calls": [
        {"name": "deploys", "arguments": {}},
        {"name": "log_signatures", "arguments": {}},
        {"name": "log_search", "arguments": LOG_SEARCH},
        {"name": "launch_fireworks", "arguments": {}},
    ],
}
CITED = conclusion(
    hypothesis="bad_deploy",
    service="payments",
    summary=WORDS,
    evidence=["ev-deploys", "ev-log_signatures"],
)


def test_in_react_the_model_picks_each_call_and_words_the_conclusion(
    builtin: None,
    fake_llm: FakeLLMServer,
    chief: User,
    model_calls: bool,
) -> None:
    fake_llm.set_script({"rules": [*REACT_RULES, CITED]})
    fake_provider(fake_llm)
    result = run_bundle("react", chief)
    session = result["session"]

    assert result["status"] == "completed"
    # The calls are the model's, in its order: log_search is no playbook read, and it
    # stopped before the playbook's follow-ups (topology, similar cases, code).
    calls = evidence_calls(session)
    assert calls[0] == "ev-bundle"
    assert [c.rsplit("-", 1)[0] if "log_search" in c else c for c in calls[1:]] == [
        "ev-deploys",
        "ev-log_search",
        "ev-log_signatures",
        "ev-anomalies",
    ]
    search = ToolCall.objects.get(session_id=session, tool_name="log_search")
    assert search.request_payload == {**LOG_SEARCH, "contains": None, "since": None, "until": None}
    assert search.status == "completed"
    notes = [p for p in payloads(session, "agent.note") if p.get("kind") == "diagnosis_model"]
    assert notes[0]["text"] == "The changes first."
    assert notes[0]["picked"] == [{"name": "deploys", "args": {}, "call": "ev-deploys"}]
    # The conclusion in the model's words, citing what it cited, bounded by the playbook.
    cause = root_cause(session)
    expected = EXPECTED["ex-deploy-payments"]
    assert (cause["hypothesis"], cause["service"]) == (expected["hypothesis"], "payments")
    # In the session's language; the other stays the playbook's.
    language = "zh" if Session.objects.get(pk=session).language == "zh" else "en"
    assert cause["summary"][language] == WORDS
    assert cause["summary"]["zh" if language == "en" else "en"] != WORDS
    assert cause["worded_by"] == "fake"
    assert cause["evidence"] == ["ev-deploys", "ev-log_signatures"]
    assert result["root_cause"]["summary"] == WORDS
    assert payloads(session, "fsm.violation") == []
    assert [a["tool"] for a in result["actions"]] == [expected["action"]["tool"]]
    purposes = [p["purpose"] for p in payloads(session, "llm.call")]
    assert purposes == ["reason"] * 5 + ["conclude"]
    # As waits, the LLM runner made the calls (its events); in the job, the job did.
    producers = set(
        Event.objects.filter(session_id=session, type="llm.call").values_list("producer", flat=True)
    )
    assert (producers == {PRODUCER}) is model_calls


def test_in_plan_execute_the_model_plans_the_calls(
    builtin: None, fake_llm: FakeLLMServer, chief: User
) -> None:
    fake_llm.set_script({"rules": [PLAN_RULE, CITED]})
    fake_provider(fake_llm)
    result = run_bundle("plan_execute", chief)
    session = result["session"]

    (plan,) = payloads(session, "diagnosis.plan")
    planned = [c["id"] for c in plan["calls"]]
    assert planned[:2] == ["ev-deploys", "ev-log_signatures"]
    assert planned[2].startswith("ev-log_search-") and len(planned) == 3
    assert plan["by"] == "fake"
    note = next(p for p in payloads(session, "agent.note") if p.get("step") == "plan")
    assert note["picked"][-1] == {
        "name": "launch_fireworks",
        "args": {},
        "refused": "unknown tool 'launch_fireworks'",
    }
    # The plan's calls, then what their reading leads to; the metrics it left unread.
    calls = evidence_calls(session)
    assert calls[1:4] == planned
    assert "ev-anomalies" not in calls
    assert "ev-similar_cases" in calls
    cause = root_cause(session)
    assert (cause["hypothesis"], cause["service"]) == ("bad_deploy", "payments")
    assert "metrics" in cause["missing"]
    assert result["root_cause"]["summary"] == WORDS


@pytest.mark.parametrize(
    "said, kinds, words",
    [
        ({"evidence": []}, ["uncited_conclusion"], "cited no tool result of this session"),
        (
            {"evidence": ["ev-bogus", "ev-bundle"]},
            ["foreign_evidence", "uncited_conclusion"],
            "no tool result of this session (ev-bogus): dropped",
        ),
        (
            {"hypothesis": "dns_failure", "service": "checkout"},
            ["outside_findings"],
            "the model concluded dns_failure (checkout), which is not among the playbook's "
            "findings: corrected to bad_deploy (payments)",
        ),
    ],
    ids=["no-citations", "a-foreign-id", "outside-the-playbook"],
)
def test_a_conclusion_the_playbook_or_the_session_does_not_bear_out_is_corrected(
    builtin: None,
    fake_llm: FakeLLMServer,
    chief: User,
    said: dict[str, Any],
    kinds: list[str],
    words: str,
    whole_timeline_on_page: None,
) -> None:
    concluded = {
        "hypothesis": "bad_deploy",
        "service": "payments",
        "summary": WORDS,
        "evidence": ["ev-deploys"],
        **said,
    }
    fake_llm.set_script({"rules": [PLAN_RULE, conclusion(**concluded)]})
    fake_provider(fake_llm)
    result = run_bundle("plan_execute", chief)
    session = result["session"]

    violations = payloads(session, "fsm.violation")
    assert [v["kind"] for v in violations] == kinds
    # Never reported as the model wrote it: the playbook's conclusion, citing its calls.
    cause = root_cause(session)
    assert (cause["hypothesis"], cause["service"]) == ("bad_deploy", "payments")
    assert WORDS not in cause["summary"].values()
    assert "worded_by" not in cause
    assert "ev-bogus" not in cause["evidence"]
    assert {"ev-deploys", "ev-log_signatures"} <= set(cause["evidence"])
    assert result["status"] == "completed"
    assert [a["tool"] for a in result["actions"]] == ["rollback_deploy"]
    # On the timeline, in words.
    page = login(chief).get(reverse("diagnosis:session-detail", args=[session]))
    assert words in page.content.decode()


def test_a_foreign_id_beside_real_ones_is_dropped_and_the_words_stay(
    builtin: None, fake_llm: FakeLLMServer, chief: User
) -> None:
    fake_llm.set_script(
        {
            "rules": [
                PLAN_RULE,
                conclusion(
                    hypothesis="bad_deploy",
                    service="payments",
                    summary=WORDS,
                    evidence=["ev-deploys", "KB-999"],
                ),
            ]
        }
    )
    fake_provider(fake_llm)
    result = run_bundle("plan_execute", chief)
    session = result["session"]

    (violation,) = payloads(session, "fsm.violation")
    assert (violation["kind"], violation["ids"]) == ("foreign_evidence", ["KB-999"])
    cause = root_cause(session)
    assert cause["evidence"] == ["ev-deploys"]
    assert result["root_cause"]["summary"] == WORDS


@pytest.mark.parametrize("mode", ["react", "plan_execute"])
def test_a_failing_model_leaves_the_offline_path_exactly_as_expected(
    builtin: None, fake_llm: FakeLLMServer, chief: User, mode: str
) -> None:
    fake_llm.set_script({"rules": [{"fault": "500"}]})
    fake_provider(fake_llm, retries=1)
    result = run_bundle(mode, chief)
    session = result["session"]

    expected = EXPECTED["ex-deploy-payments"]
    cause = root_cause(session)
    assert (cause["hypothesis"], cause["service"], cause["deploy"]) == (
        expected["hypothesis"],
        expected["service"],
        expected["deploy"],
    )
    assert result["code_locations"][0] == {
        "path": expected["code_path"],
        "line": expected["code_line"],
    }
    assert [c["id"] for c in result["similar_cases"]][:1] == expected["similar"]
    assert "worded_by" not in cause
    assert payloads(session, "llm.fallback")
    assert payloads(session, "fsm.violation") == []
    assert result["actions"][0]["status"] == "completed"


def specialist(name: str, after: str | None = None, **reply: Any) -> dict[str, Any]:
    """A rule for one specialist's conversation (its first message names it)."""
    match: dict[str, Any] = {"has_tools": True, "last_user": f"the {name} specialist"}
    if after is not None:
        match["after_tool"] = after
    return {"match": match, **reply}


def test_in_hierarchical_each_specialist_chooses_its_calls_in_its_own_node(
    builtin: None, fake_llm: FakeLLMServer, chief: User, model_calls: bool
) -> None:
    fake_llm.set_script(
        {
            "rules": [
                specialist("logs", "log_search", tool_calls=[{"name": "log_signatures"}]),
                specialist(
                    "logs",
                    content="The payments errors first.",
                    tool_calls=[{"name": "log_search", "arguments": LOG_SEARCH}],
                ),
                specialist("metrics", content="The metrics can wait."),
                specialist("changes_code", "deploys", content="The deploy is enough."),
                specialist("changes_code", tool_calls=[{"name": "deploys"}]),
                specialist("knowledge", "similar_cases", content="No past case to add."),
                specialist(
                    "knowledge",
                    tool_calls=[{"name": "similar_cases"}, {"name": "log_search"}],
                ),
                CITED,
            ]
        }
    )
    fake_provider(fake_llm)
    result = run_bundle("hierarchical", chief)
    session = result["session"]
    assert result["status"] == "completed"
    calls = evidence_calls(session)
    assert "ev-anomalies" not in calls  # the metrics specialist chose to read nothing
    assert {"ev-log_signatures", "ev-deploys", "ev-similar_cases"} <= set(calls)
    assert not [c for c in calls if c.startswith("ev-code")]
    # Each specialist's calls and model calls are under its own run, in its own node.
    tree = read_tree(session)
    nodes = {node.agent_name: node for node, _ in tree.walk()}
    search = ToolCall.objects.get(session_id=session, tool_name="log_search")
    assert search.agent_run is not None
    assert search.agent_run.parent_id == nodes["specialist_logs"].id
    for name in ("logs", "metrics", "changes_code", "knowledge"):
        assert nodes[f"specialist_{name}"].tokens_in > 0, name
    # Each specialist's words in its own subtree of the tree, in no other's: with waits
    # the LLM runner's call is under the specialist's run, in the job under its step's.
    texts = {
        name: {n.text for n, _ in AgentTree([nodes[f"specialist_{name}"]], 0, 0).walk()}
        for name in ("logs", "metrics", "changes_code", "knowledge")
    }
    assert "The metrics can wait." in texts["metrics"]
    assert "No past case to add." in texts["knowledge"]
    assert "The metrics can wait." not in texts["logs"] | texts["changes_code"] | texts["knowledge"]
    if model_calls:  # the specialists asked the model as waits of their own jobs
        assert nodes["specialist_metrics"].text == "The metrics can wait."
        specialist_calls = Event.objects.filter(
            session_id=session, type="llm.call", payload__purpose="specialist"
        )
        assert {e.producer for e in specialist_calls} == {PRODUCER}
        assert {e.run_id for e in specialist_calls} <= {nodes[f"specialist_{n}"].id for n in texts}
    notes = [p for p in payloads(session, "agent.note") if p.get("step") == "specialist"]
    refused = [a for n in notes for a in n["picked"] if "refused" in a]
    assert refused == [
        {
            "name": "log_search",
            "args": {},
            "refused": "log_search is not among this agent's tools (topology, similar_cases)",
        }
    ]
    cause = root_cause(session)
    assert (cause["hypothesis"], cause["service"]) == ("bad_deploy", "payments")
    assert "metrics" in cause["missing"]
    assert result["root_cause"]["summary"] == WORDS
