"""The agent tree: GET /api/v1/diagnosis-sessions/{id}/agent-tree, the session page's
live panel, replay's filter by subtree and the export's section. Generic over session
kinds: an apron session's job runs and node runs here, with child runs added under a
node run as a pack's specialists are (the tree does not know who made them)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from diagnosis.agent_tree import MAX_RUNS, read_tree
from diagnosis.eventlog.masking import MASKED, mask_of
from diagnosis.events import append_event
from diagnosis.models import AgentRun, LLMCall, Session, ToolCall, ToolCallStatus
from packs.diagnosis.sessions import start_from_bundle
from tests.api_helpers import call, token_for
from tests.test_live_timeline import open_socket, receive_until
from tests.web_helpers import login, waiting_session

pytestmark = [pytest.mark.services]

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"

SESSIONS = "/api/v1/diagnosis-sessions"


def tree_url(session: Session | uuid.UUID) -> str:
    return f"{SESSIONS}/{getattr(session, 'pk', session)}/agent-tree"


def add_specialists(session: Session, count: int = 2) -> dict[str, AgentRun]:
    """An orchestrator under the session's first job run with `count` specialists, the
    first running a tool now and each with a model call; as a pack's hierarchical mode
    writes them (AgentRun rows with parents), not through it."""
    root = AgentRun.objects.filter(session=session, parent__isnull=True).order_by("id").first()
    assert root is not None
    start = timezone.now() - timedelta(seconds=30)
    orchestrator = AgentRun.objects.create(
        session=session, parent=root, agent_name="orchestrator", mode="hierarchical"
    )
    AgentRun.objects.filter(pk=orchestrator.pk).update(started_at=start)
    runs = {"root": root, "orchestrator": orchestrator}
    for i in range(count):
        specialist = AgentRun.objects.create(
            session=session,
            parent=orchestrator,
            agent_name=f"specialist_{i}",
            mode="react",
            status="running" if i == 0 else "completed",
            ended_at=None if i == 0 else start + timedelta(seconds=12),
        )
        AgentRun.objects.filter(pk=specialist.pk).update(started_at=start + timedelta(seconds=2))
        LLMCall.objects.create(
            session=session,
            agent_run=specialist,
            provider="sim",
            model="m",
            purpose="reason",
            tokens_in=100 + i,
            tokens_out=10 + i,
            cost=Decimal(0),
        )
        runs[f"specialist_{i}"] = specialist
    ToolCall.objects.create(
        session=session,
        agent_run=runs["specialist_0"],
        call_id=f"tree-{uuid.uuid4().hex}",
        tool_name="query_metrics",
        idempotency_key=f"tree-{uuid.uuid4().hex}",
        status=ToolCallStatus.RUNNING,
    )
    return runs


def diagnosis_session(user: User, stored: Path) -> Session:
    with override_settings(AERO_BUNDLE_DIR=stored):
        session = start_from_bundle(
            user, EXAMPLES / "ex-deploy-payments.tar.gz", {"producer": "test"}
        )
    return Session.objects.get(pk=session.pk)


def find(nodes: list[dict[str, Any]], run_id: int) -> dict[str, Any] | None:
    for node in nodes:
        if node["id"] == run_id:
            return node
        found = find(node["children"], run_id)
        if found is not None:
            return found
    return None


# --- the API ---------------------------------------------------------------------------


def test_the_api_serves_the_tree_nested_with_times_tokens_and_the_running_tool(
    builtin: None, alice: User
) -> None:
    session = waiting_session(alice)
    runs = add_specialists(session)
    body = call("GET", tree_url(session), token_for(alice)).json()

    assert body["session_id"] == str(session.pk)
    assert body["total_runs"] == AgentRun.objects.filter(session=session).count()
    assert body["truncated"] is False and body["limit"] == MAX_RUNS
    [root] = [r for r in body["runs"] if r["id"] == runs["root"].pk]
    assert root["parent"] is None and root["agent_name"] == "incident_agent"
    # the job's node runs in the order they ran (the orchestrator started before them)
    names = [child["agent_name"] for child in root["children"]]
    assert names[0] == "orchestrator" and names.index("input_parser") < names.index("reasoning")
    orchestrator = find(body["runs"], runs["orchestrator"].pk)
    assert orchestrator is not None and orchestrator["parent"] == root["id"]
    assert orchestrator["mode"] == "hierarchical"
    running, done = orchestrator["children"]
    assert running["agent_name"] == "specialist_0" and running["status"] == "running"
    assert running["current_tool"] == "query_metrics" and running["ended_at"] is None
    assert running["elapsed_seconds"] >= 28  # still counting
    assert done["status"] == "completed" and done["current_tool"] is None
    assert done["elapsed_seconds"] == pytest.approx(10, abs=0.01)
    assert (running["tokens_in"], running["tokens_out"]) == (100, 10)
    # a parent counts what every run below it used
    assert (orchestrator["tokens_in"], orchestrator["tokens_out"]) == (201, 21)
    assert root["tokens_in"] >= 201


def test_auditors_see_the_tree_masked_like_the_timeline(
    builtin: None, alice: User, carol: User, tmp_path: Path
) -> None:
    # an IT diagnosis: its R2 fix waits for approval, its arguments hidden from auditors
    session = diagnosis_session(alice, tmp_path / "stored")
    hidden = sorted(v for v in mask_of(session.pk).secrets if len(v) > 3)
    assert hidden, "the fix is masked for auditors"
    step = AgentRun.objects.filter(session=session, parent__isnull=False).first()
    assert step is not None
    AgentRun.objects.filter(pk=step.pk).update(output_summary={"summary": f"chose {hidden[0]}"})

    def summary_for(token: str) -> str:
        node = find(call("GET", tree_url(session), token).json()["runs"], step.pk)
        assert node is not None
        return str(node["output_summary"]["summary"])

    assert summary_for(token_for(alice)) == f"chose {hidden[0]}"
    assert summary_for(token_for(carol)) == f"chose {MASKED}"


def test_the_api_refuses_the_tree_without_access(
    builtin: None, alice: User, make_user: Any
) -> None:
    session = waiting_session(alice)
    for token in (None, "aero_not-a-token"):
        response = call("GET", tree_url(session), token)
        assert response.status_code == 401 and response.json()["code"] == "unauthenticated"
    # a token whose user lost every role reads nothing
    former = make_user("former", "auditor")
    token = token_for(former)
    former.groups.clear()
    assert call("GET", tree_url(session), token).status_code == 403
    # unknown and deleted sessions are not found
    reader = token_for(alice)
    assert call("GET", tree_url(uuid.uuid4()), reader).status_code == 404
    Session.objects.filter(pk=session.pk).update(deleted_at=timezone.now())
    assert call("GET", tree_url(session), reader).status_code == 404
    assert call("GET", f"{SESSIONS}/not-a-uuid/agent-tree", reader).status_code == 422


def test_the_api_reads_the_tree_in_constant_queries(builtin: None, alice: User) -> None:
    session = waiting_session(alice)
    token = token_for(alice)
    call("GET", tree_url(session), token)  # warm the token and role caches

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert call("GET", tree_url(session), token).status_code == 200
        return len(captured)

    few = queries()
    add_specialists(session, count=40)
    assert AgentRun.objects.filter(session=session).count() > 50
    assert queries() == few


def test_a_huge_tree_is_cut_and_says_so(builtin: None, alice: User) -> None:
    session = waiting_session(alice)
    runs = AgentRun.objects.filter(session=session).count()
    tree = read_tree(session.pk, limit=runs - 1)
    assert tree.truncated and tree.total == runs and tree.shown == runs - 1
    assert not read_tree(session.pk, limit=runs).truncated
    body = call("GET", tree_url(session), token_for(alice)).json()
    assert body["truncated"] is False


def test_the_openapi_document_describes_the_tree(db: None) -> None:
    schema = call("GET", "/api/v1/openapi.json").json()
    operation = schema["paths"]["/api/v1/diagnosis-sessions/{session_id}/agent-tree"]["get"]
    assert "200" in operation["responses"] and "404" in operation["responses"]
    node = schema["components"]["schemas"]["RunNode"]["properties"]
    assert {"parent", "elapsed_seconds", "tokens_in", "tokens_out", "current_tool"} <= set(node)
    assert {"truncated", "total_runs"} <= set(
        schema["components"]["schemas"]["AgentTreeOut"]["properties"]
    )


# --- the session page ------------------------------------------------------------------


def page_of(user: User | None, session: Session, language: str = "en") -> Any:
    client = login(user)
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = language
    return client.get(reverse("diagnosis:session-detail", args=[session.pk]))


def panel_of(html: str) -> str:
    found = re.search(r'<section id="session-agents".*?</section>', html, re.S)
    assert found, "the page has the agent tree panel"
    return found.group()


def test_the_session_page_shows_the_tree_collapsible_with_status_tool_time_and_tokens(
    builtin: None, alice: User, carol: User
) -> None:
    session = waiting_session(alice)
    runs = add_specialists(session)
    panel = panel_of(page_of(alice, session).content.decode())
    # details/summary: opens and closes without script
    assert '<details id="agent-tree" data-keep-state open>' in panel
    assert f'<details id="run-{runs["orchestrator"].pk}"' in panel
    total = AgentRun.objects.filter(session=session).count()
    assert f"{total} runs · 2 running" in panel  # the orchestrator and its specialist
    running = re.search(rf'<li [^>]*data-run="{runs["specialist_0"].pk}".*?</li>', panel, re.S)
    assert running is not None
    line = running.group()
    assert 'data-status="running"' in line and "now: query_metrics" in line
    assert "100/10 tokens" in line and "ReAct" in line
    done = re.search(rf'<li [^>]*data-run="{runs["specialist_1"].pk}".*?</li>', panel, re.S)
    assert done is not None and "10.0 s" in done.group() and "now:" not in done.group()
    assert "reading the message" in panel  # a step of the agent's graph, in words
    assert "Hierarchical" in panel and "201/21 tokens" in panel  # the orchestrator's sum
    # auditors see the same tree (it shows no step's summary, nothing to mask)
    assert "now: query_metrics" in panel_of(page_of(carol, session).content.decode())


def test_the_tree_in_chinese(builtin: None, alice: User) -> None:
    session = waiting_session(alice)
    add_specialists(session)
    panel = panel_of(page_of(alice, session, "zh-hans").content.decode())
    assert "智能体" in panel and "运行中" in panel and "分层" in panel
    assert "10.0 秒" in panel and "201/21 个 token" in panel


def test_the_page_refuses_whoever_may_not_view_sessions(
    builtin: None, alice: User, dave: User
) -> None:
    session = waiting_session(alice)
    assert page_of(dave, session).status_code == 403
    anonymous = page_of(None, session)
    assert anonymous.status_code == 302 and "login" in anonymous["Location"]


def test_the_page_reads_the_tree_in_constant_queries(builtin: None, alice: User) -> None:
    session = waiting_session(alice)
    page_of(alice, session)  # per-process caches (the definition) warm

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert page_of(alice, session).status_code == 200
        return len(captured)

    few = queries()
    add_specialists(session, count=40)
    assert queries() == few


def test_the_tree_is_pushed_over_the_websocket_when_a_run_writes(
    builtin: None, asgi_server: str, alice: User
) -> None:
    session = waiting_session(alice)
    runs = add_specialists(session)
    specialist = runs["specialist_0"]
    seen = session.last_seq
    with open_socket(asgi_server, session, alice, last_seq=seen) as ws:
        # a notice and a pull: the event the specialist wrote, then its tree as the rows say
        append_event(session.pk, "agent.note", {"text": "looking"}, producer="test", run=specialist)
        _, html = receive_until(ws, lambda s, _: bool(s) and s[-1] >= seen + 1)
        panel = panel_of(html)
        assert 'hx-swap-oob="true"' in panel and "now: query_metrics" in panel

        ToolCall.objects.filter(agent_run=specialist).update(status=ToolCallStatus.COMPLETED)
        AgentRun.objects.filter(pk__in=[specialist.pk, runs["orchestrator"].pk]).update(
            status="completed", ended_at=timezone.now()
        )
        append_event(session.pk, "agent.note", {"text": "done"}, producer="test", run=specialist)
        _, html = receive_until(ws, lambda s, _: bool(s) and s[-1] >= seen + 2)
        panel = panel_of(html)
        assert "now:" not in panel and " running" not in panel
        line = re.search(rf'<li [^>]*data-run="{specialist.pk}".*?</li>', panel, re.S)
        assert line is not None and 'data-status="completed"' in line.group()

        # an event no run wrote (a person's) leaves the tree alone
        append_event(session.pk, "agent.note", {"text": "by hand"}, producer="test")
        _, html = receive_until(ws, lambda s, _: bool(s) and s[-1] >= seen + 3)
        assert 'id="session-agents"' not in html


# --- replay: the timeline of one run and the runs below it ----------------------------


def test_replay_filters_the_timeline_by_a_runs_subtree(
    builtin: None, alice: User, carol: User
) -> None:
    session = waiting_session(alice)
    runs = add_specialists(session)
    for name in ("orchestrator", "specialist_0", "specialist_1"):
        append_event(
            session.pk, "agent.note", {"text": f"by {name}"}, producer="test", run=runs[name]
        )
    session.refresh_from_db()
    step = reverse("replay:replay-step", args=[session.pk])
    client = login(carol)

    page = client.get(step, {"seq": session.last_seq, "run": runs["orchestrator"].pk})
    assert page.status_code == 200
    shown = {e.seq: e for e in page.context["events"]}
    subtree = {runs[n].pk for n in ("orchestrator", "specialist_0", "specialist_1")}
    assert shown and {e.run_id for e in shown.values()} == subtree
    assert {e.payload["text"] for e in shown.values()} == {
        "by orchestrator",
        "by specialist_0",
        "by specialist_1",
    }
    html = page.content.decode()
    # every run is a link that filters to it; the chosen run's ancestors are unfolded
    tree = re.search(r'<ul class="plain run-tree".*?</ul>\s*(?=<p|<h2)', html, re.S)
    assert tree is not None
    for run in AgentRun.objects.filter(session=session):
        assert f"run={run.pk}" in tree.group()
    assert f'run={runs["orchestrator"].pk}" aria-current="true"' in tree.group()
    root = runs["root"].pk
    assert re.search(rf'<li data-run="{root}"><details open>', tree.group())

    # one specialist: its events only, the orchestrator's and the job's steps left out
    page = client.get(step, {"seq": session.last_seq, "run": runs["specialist_1"].pk})
    assert [e.payload.get("text") for e in page.context["events"]] == ["by specialist_1"]
    # the job's run: its node runs' events and the specialists' below it
    page = client.get(step, {"seq": session.last_seq, "run": root})
    types = {e.type for e in page.context["events"]}
    assert "agent.node_started" in types or "agent.node_completed" in types
    assert all(e.run_id is not None for e in page.context["events"])
    # a run of another session filters everything out, it never shows that session's
    other = waiting_session(alice)
    foreign = AgentRun.objects.filter(session=other).first()
    assert foreign is not None
    page = client.get(step, {"seq": session.last_seq, "run": foreign.pk})
    assert page.status_code == 200 and page.context["events"] == []


def test_replay_refuses_whoever_may_not_view_sessions(
    builtin: None, alice: User, dave: User
) -> None:
    session = waiting_session(alice)
    step = reverse("replay:replay-step", args=[session.pk])
    run = AgentRun.objects.filter(session=session).first()
    assert run is not None
    assert login(dave).get(step, {"run": run.pk}).status_code == 403
    assert login(None).get(step, {"run": run.pk}).status_code == 302
    assert login(alice).get(step, {"run": "x"}).status_code == 400


# --- the export and the command's JSON --------------------------------------------------


def test_the_export_has_the_agent_tree_as_an_indented_list(
    builtin: None, alice: User, carol: User
) -> None:
    session = waiting_session(alice)
    runs = add_specialists(session)
    export = reverse("replay:replay-export", args=[session.pk])
    text = login(alice).post(export).content.decode()
    section = text.split("## 6. Agent tree\n")[1].split("\n## 7. ")[0]
    lines = [line for line in section.splitlines() if line.strip()]
    assert len(lines) == AgentRun.objects.filter(session=session).count()
    root, orchestrator = runs["root"], runs["orchestrator"]
    assert lines[0].startswith(f"- incident_agent #{root.pk}: ReAct, completed, ")
    # each run one level under its parent, two spaces a level
    assert (
        f"  - orchestrator #{orchestrator.pk}: Hierarchical, running, " in section
        and ", 201/21 tokens" in section
    )
    specialist = runs["specialist_0"].pk
    assert f"    - specialist_0 #{specialist}: ReAct, running, " in section
    assert "100/10 tokens, now: query_metrics" in section
    assert f"    - specialist_1 #{runs['specialist_1'].pk}: ReAct, completed, 10.0 s," in section

    client = login(carol)  # an auditor's export is in Chinese here, with the same tree
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = "zh-hans"
    chinese = client.post(export).content.decode()
    section = chinese.split("## 6. 智能体树\n")[1].split("\n## 7. ")[0]
    assert f"  - orchestrator #{orchestrator.pk}: 分层, 运行中, " in section
    assert "10.0 秒" in section and "正在执行：query_metrics" in section


def test_the_export_refuses_whoever_may_not_view_sessions(
    builtin: None, alice: User, dave: User
) -> None:
    session = waiting_session(alice)
    export = reverse("replay:replay-export", args=[session.pk])
    assert login(dave).post(export).status_code == 403
    assert login(None).post(export).status_code == 302


def test_the_commands_json_lists_the_agents_with_their_parents(
    builtin: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    capsys.readouterr()
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        call_command(
            "incident",
            "run",
            "--bundle",
            str(EXAMPLES / "ex-deploy-payments.tar.gz"),
            "--mode",
            "hierarchical",
            "--json",
        )
    result = json.loads(capsys.readouterr().out)
    tree = result["agent_tree"]
    assert all(set(node) == {"run", "parent", "agent", "mode", "status"} for node in tree)
    rows = {
        run.pk: (run.parent_id, run.agent_name, run.mode, run.status)
        for run in AgentRun.objects.filter(session_id=result["session"])
    }
    assert all(rows[n["run"]] == (n["parent"], n["agent"], n["mode"], n["status"]) for n in tree)
    # the agents, not the steps of their graphs: every job's run, the orchestrator, its
    # four specialists each under it
    roots = [run for run, row in rows.items() if row[0] is None]
    assert [n["run"] for n in tree if n["parent"] is None] == sorted(roots)
    [orchestrator] = [n for n in tree if n["agent"] == "orchestrate"]
    specialists = [n for n in tree if n["agent"].startswith("specialist_")]
    assert len(specialists) == 4
    assert all(n["parent"] == orchestrator["run"] for n in specialists)
    # depth first: an agent comes after its parent
    seen: set[int] = set()
    for node in tree:
        assert node["parent"] is None or node["parent"] in seen
        seen.add(node["run"])
    assert tree.index(orchestrator) < min(tree.index(n) for n in specialists)
