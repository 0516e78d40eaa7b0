"""The knowledge base as an on-call engineer meets it: a concluded diagnosis lists the
past cases most like it (the shipped examples find their own knowledge item first) on
its page, in the command line's JSON, the API and the Markdown export; a completed
session is saved into the knowledge base by an operator; admins edit the items."""

from __future__ import annotations

import importlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import translation
from pydantic import ValidationError

from aero.models import AuditLog
from diagnosis.actions import do_retry
from diagnosis.agent.nodes import waiting
from diagnosis.models import Event, Session, ToolCall
from packs.diagnosis import investigation
from packs.diagnosis.knowledge import (
    SimilarCasesArgs,
    embedded_scores,
    similar_cases_tool,
    trigram_similarity,
    words,
)
from packs.diagnosis.models import KnowledgeItem, KnowledgeSource, SimilarCase
from packs.diagnosis.names import SIMILAR
from packs.diagnosis.sessions import start_from_bundle
from packs.diagnosis.system import demo_shop
from replay.export import render_export
from tests.admin_helpers import admin_client, form_data, staff_with
from tests.api_helpers import token_for
from tests.web_helpers import login

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
EXPECTED = yaml.safe_load((EXAMPLES / "expected.yaml").read_text("utf-8"))
SAVE = "diagnosis_pack:save-knowledge"

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def run(capsys: pytest.CaptureFixture[str], name: str, *options: str) -> dict[str, Any]:
    capsys.readouterr()
    call_command(
        "incident", "run", "--bundle", str(EXAMPLES / f"{name}.tar.gz"), *options, "--json"
    )
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_shipped_example_finds_its_own_past_case_first(
    builtin: None, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    result = run(capsys, name)

    similar = result["similar_cases"]
    assert similar[0]["id"] == EXPECTED[name]["similar"][0]
    assert similar[0]["strategy"] == "pg_fts+trgm"
    assert [c["score"] for c in similar] == sorted((c["score"] for c in similar), reverse=True)
    assert 0 < similar[0]["score"] <= 1
    # the links are stored and the search is in the log, with the same ids and scores
    session = Session.objects.get(pk=result["session"])
    links = list(SimilarCase.objects.filter(session=session).order_by("rank"))
    assert [(link.item.key, link.score) for link in links] == [
        (c["id"], c["score"]) for c in similar
    ]
    event = Event.objects.get(session=session, type="diagnosis.similar_cases")
    assert [c["id"] for c in event.payload["cases"]] == [c["id"] for c in similar]


def test_the_agent_searches_past_cases_as_an_evidence_call_logged_once(
    builtin: None, alice: User, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    """`similar_cases(text, services?)` is an R0 evidence call made with the evidence (the
    incident's words, the suspects' new errors, the services in play, the suspect first),
    before the conclusion, with its result summary. The steps run again (a crash after
    they committed, before the checkpoint) leave one search call, one
    `diagnosis.similar_cases` event and one set of links; the conclusion does not cite
    the search."""
    original = waiting.wait_for_user
    crashes = {"left": settings.AERO_JOB_ATTEMPTS}

    def crash_before_the_wait(*args: Any) -> Any:
        # after the steps up to the fix's proposal committed, before the wait's checkpoint:
        # each attempt and the retry start again from the beginning
        if crashes["left"]:
            crashes["left"] -= 1
            raise RuntimeError("worker lost its database connection")
        return original(*args)

    monkeypatch.setattr(waiting, "wait_for_user", crash_before_the_wait)
    gathered: list[str] = []
    run_call = investigation.Investigation.run

    def counted(self: Any, tctx: Any, call: dict[str, Any]) -> Any:
        if call["tool"] == "similar_cases":
            gathered.append("ran")
        return run_call(self, tctx, call)

    monkeypatch.setattr(investigation.Investigation, "run", counted)
    session = start_from_bundle(alice, EXAMPLES / "ex-pool-inventory.tar.gz", {"producer": "t"})
    session.refresh_from_db()
    assert session.status == "failed"
    # as if the process died before its checkpoint: the retry runs every step again
    with connection.cursor() as cursor:
        for table in ("checkpoint_writes", "checkpoint_blobs", "checkpoints"):
            cursor.execute(f"DELETE FROM {table} WHERE thread_id = %s", [str(session.pk)])
    do_retry(session.pk, alice)
    assert len(gathered) == 2, "the evidence step ran again"

    call = ToolCall.objects.get(session=session, tool_name="similar_cases")
    assert (call.risk_class, call.is_action, call.status) == ("R0", False, "completed")
    assert call.request_payload["services"][0] == "inventory"
    assert "Stock checks time out" in call.request_payload["text"]
    assert "connection from the pool" in call.request_payload["text"]
    assert call.response_payload["summary"].startswith("5 similar past cases: KB-003 (")
    events = Event.objects.filter(session=session)
    assert events.filter(type="tool.call_started", payload__call_id=call.call_id).count() == 1
    done = events.get(type="tool.call_completed", payload__call_id=call.call_id)
    found = events.get(type=SIMILAR)
    cause = events.get(type="finding.recorded", payload__kind="root_cause")
    assert done.seq < found.seq < cause.seq, "searched with the evidence, before concluding"
    assert [c["id"] for c in found.payload["cases"]] == [
        link.item.key for link in SimilarCase.objects.filter(session=session).order_by("rank")
    ]
    assert found.payload["cases"][0]["id"] == "KB-003"
    assert call.call_id not in cause.payload["evidence"]


def test_a_bad_search_is_refused_by_the_tools_schema_and_stores_nothing(
    builtin: None, alice: User
) -> None:
    session = start_from_bundle(alice, EXAMPLES / "ex-pool-inventory.tar.gz", {"producer": "t"})
    kept = list(SimilarCase.objects.filter(session=session).values_list("item__key", "score"))
    for args in ({"text": ""}, {"text": "pool", "services": [3]}, {"text": "x", "since": "1h"}):
        with pytest.raises(ValidationError):
            similar_cases_tool(session.pk, args)
    after = list(SimilarCase.objects.filter(session=session).values_list("item__key", "score"))
    assert after == kept and kept
    schema = SimilarCasesArgs.model_json_schema()
    assert schema["required"] == ["text"] and set(schema["properties"]) == {"text", "services"}


def test_a_failed_search_fails_its_call_and_the_diagnosis_goes_on(
    builtin: None, alice: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(session_id: Any, args: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("canceling statement due to statement timeout")

    monkeypatch.setattr(investigation, "similar_cases_tool", down)
    session = start_from_bundle(alice, EXAMPLES / "ex-pool-inventory.tar.gz", {"producer": "t"})

    call = ToolCall.objects.get(session=session, tool_name="similar_cases")
    assert call.status == "failed" and "statement timeout" in call.error
    assert not Event.objects.filter(session=session, type=SIMILAR).exists()
    session.refresh_from_db()
    assert session.snapshot["root_cause"]["service"] == "inventory"
    page = login(alice).get(reverse("diagnosis:session-detail", args=[session.pk]))
    assert 'data-testid="similar-failed"' in page.content.decode()


def test_the_report_fields_in_the_json_and_the_api(
    builtin: None, capsys: pytest.CaptureFixture[str], alice: User
) -> None:
    result = run(capsys, "ex-deploy-payments", "--decide", "approve")
    # the keys the command always had are still there
    assert result["root_cause"]["service"] == "payments"
    assert result["confidence"] == result["confidence_score"]
    assert "payments/app/handlers.py:26" in result["root_cause_md"]
    assert "D-5716" in result["root_cause_md"]
    # in the session's language (this bundle's is Chinese): the rollback, in words
    assert "回滚发布" in result["fix_suggestion_md"] and "D-5716" in result["fix_suggestion_md"]
    # the written report (in the session's language: this bundle's is Chinese) lists the
    # three best past cases, best first
    session = Session.objects.get(pk=result["session"])
    heading = {"zh": "## 相似案例", "en": "## Similar cases"}[session.language]
    listed = session.report.markdown.split(heading)[1].strip().splitlines()
    assert len(listed) == 3 and listed[0].startswith("- KB-011 支付服务发布后签名校验失败")
    assert str(result["similar_cases"][0]["score"]) in listed[0] and "pg_fts+trgm" in listed[0]

    token = token_for(alice, "operator")
    got = Client().get(
        f"/api/v1/diagnosis-sessions/{result['session']}", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert got.status_code == 200
    report = got.json()["report"]
    assert report["root_cause_md"] == result["root_cause_md"]
    assert report["confidence_score"] == result["confidence"]
    assert report["related_services"] == result["related_services"]
    assert report["code_locations"] == [{"path": "payments/app/handlers.py", "line": 26}]
    assert report["similar_cases"][0]["id"] == "KB-011"
    assert len(report["similar_cases"]) <= 3

    refused = Client().get(f"/api/v1/diagnosis-sessions/{result['session']}")
    assert refused.status_code == 401


def test_an_auditor_reads_the_report_fields_masked_as_the_snapshot(
    builtin: None, capsys: pytest.CaptureFixture[str], carol: User
) -> None:
    result = run(capsys, "ex-deploy-payments", "--decide", "approve")
    token = token_for(carol, "auditor")
    url = f"/api/v1/diagnosis-sessions/{result['session']}"
    got = Client().get(url, HTTP_AUTHORIZATION=f"Bearer {token}").json()
    # the R2 rollback's arguments are hidden from read-only viewers, here as everywhere
    assert got["snapshot"]["root_cause"]["deploy"] == "masked"
    report = got["report"]
    assert "D-5716" not in report["root_cause_md"] + report["fix_suggestion_md"]
    assert "deploy=masked" in report["fix_suggestion_md"]
    assert report["similar_cases"][0]["id"] == "KB-011"


def test_the_page_shows_the_three_best_past_cases(builtin: None, alice: User) -> None:
    client = login(alice)
    opened = client.post(reverse("diagnosis_pack:new"), {"demo": "ex-pool-inventory"})
    page = client.get(opened["Location"]).content.decode()

    assert 'data-testid="similar-cases"' in page
    listed = page.split('data-testid="similar-cases"')[1].split("</ol>")[0]
    assert listed.count('data-item="') == 3
    assert listed.index('data-item="KB-003"') == listed.index('data-item="')
    assert "库存服务连接池耗尽" in listed

    client.post(reverse("set-language"), {"language": "zh-hans", "next": "/"})
    chinese = client.get(opened["Location"]).content.decode()
    assert "相似的历史案例" in chinese and "得分 0." in chinese


def test_a_past_case_written_in_both_languages_shows_in_the_readers(
    builtin: None, alice: User
) -> None:
    """The page picks an item's texts by its reader's language, not the session's; an
    item written in one language only (the shipped ones) shows in that one."""
    client = login(alice)
    opened = client.post(reverse("diagnosis_pack:new"), {"demo": "ex-pool-inventory"})
    KnowledgeItem.objects.filter(key="KB-003").update(
        title_en="Inventory connection pool exhausted", fix_en="Give the job its own pool."
    )
    english = client.get(opened["Location"]).content.decode()
    listed = english.split('data-testid="similar-cases"')[1].split("</ol>")[0]
    assert "Inventory connection pool exhausted" in listed and "库存服务连接池耗尽" not in listed
    assert "Give the job its own pool." in listed

    client.post(reverse("set-language"), {"language": "zh-hans", "next": "/"})
    chinese = client.get(opened["Location"]).content.decode()
    listed = chinese.split('data-testid="similar-cases"')[1].split("</ol>")[0]
    assert "库存服务连接池耗尽" in listed and "Inventory connection pool exhausted" not in listed


def _sections(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("## ")]


def test_the_markdown_export_has_seed_003s_sections_in_both_languages(
    builtin: None, capsys: pytest.CaptureFixture[str], alice: User
) -> None:
    result = run(capsys, "ex-pool-inventory", "--decide", "approve")
    session = Session.objects.get(pk=result["session"])

    with translation.override("en"):
        english = render_export(session, alice, masked=False)
    assert _sections(english) == [
        "## 1. Session",
        "## 2. Root cause",
        "## 3. Evidence chain",
        "## 4. Approval record",
        "## 5. Tokens and cost",
        "## 6. Agent tree",
        "## 7. Fix suggestions",
        "## 8. Similar cases",
        "## 9. Recommended follow-ups",
        "## 10. Chronology",
        "## 11. Hash chain",
    ]
    assert english.startswith("# IT diagnosis export")
    assert f"| Problem type | {result['problem_type']} |" in english
    assert "database connection pool of inventory is exhausted" in english
    assert "| KB-003 |" in english.split("## 8. Similar cases")[1]
    fixes = english.split("## 7. Fix suggestions")[1].split("## 8.")[0]
    assert "**Restart the service** (service=inventory), R2: approved" in fixes
    # what fixed the past case of the same kind, not those of other kinds
    assert "As in KB-003:" in fixes and "KB-009" not in fixes

    with translation.override("zh-hans"):
        chinese = render_export(session, alice, masked=False)
    assert _sections(chinese) == [
        "## 1. 会话",
        "## 2. 根因",
        "## 3. 证据链",
        "## 4. 审批记录",
        "## 5. 令牌与费用",
        "## 6. 智能体树",
        "## 7. 修复建议",
        "## 8. 相似案例",
        "## 9. 建议的后续工作",
        "## 10. 时间线",
        "## 11. 哈希链",
    ]
    assert "| KB-003 |" in chinese


def test_an_operator_saves_a_completed_diagnosis_once(
    builtin: None, capsys: pytest.CaptureFixture[str], alice: User, carol: User
) -> None:
    result = run(capsys, "ex-pool-inventory", "--decide", "approve")
    session = Session.objects.get(pk=result["session"])
    url = reverse(SAVE, args=[session.pk])

    # an auditor sees the session but may not save it; signed out goes to sign in
    auditor = login(carol)
    assert (
        'data-testid="save-knowledge"'
        not in auditor.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    )
    assert auditor.post(url).status_code == 403
    assert Client().post(url).status_code == 302
    assert not KnowledgeItem.objects.filter(session=session).exists()

    client = login(alice)
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert 'data-testid="save-knowledge"' in page
    assert client.post(url).status_code == 302

    item = KnowledgeItem.objects.get(session=session)
    assert item.source == KnowledgeSource.SESSION
    assert (item.hypothesis, item.problem_type) == ("db_pool_exhausted", result["problem_type"])
    assert "inventory" in item.services
    assert "database connection pool of inventory is exhausted" in item.root_cause_en
    assert item.created_by == alice
    saved = Event.objects.get(session=session, type="diagnosis.knowledge_saved")
    assert saved.payload == {"id": item.key, "item": item.pk, "by": "alice"}
    assert AuditLog.objects.filter(action="knowledge.saved", actor=alice).count() == 1
    page = client.get(reverse("diagnosis:session-detail", args=[session.pk])).content.decode()
    assert f"In the knowledge base as {item.key}." in page

    # once only
    client.post(url)
    assert KnowledgeItem.objects.filter(session=session).count() == 1
    assert Event.objects.filter(session=session, type="diagnosis.knowledge_saved").count() == 1

    # the next diagnosis of the same kind finds the saved session among its past cases,
    # and a session never finds itself
    again = run(capsys, "ex-pool-inventory")
    assert item.key in [c["id"] for c in again["similar_cases"]]
    asked = ToolCall.objects.get(session=session, tool_name="similar_cases").request_payload
    assert item.key not in [c["id"] for c in similar_cases_tool(session.pk, asked)["cases"]]


def test_an_unfinished_diagnosis_is_not_saved(
    builtin: None, capsys: pytest.CaptureFixture[str], alice: User
) -> None:
    result = run(capsys, "ex-pool-inventory")  # the fix still waits for approval
    session = Session.objects.get(pk=result["session"])
    client = login(alice)
    client.post(reverse(SAVE, args=[session.pk]))
    assert not KnowledgeItem.objects.filter(session=session).exists()
    assert not Event.objects.filter(session=session, type="diagnosis.knowledge_saved").exists()


def test_admins_edit_knowledge_items_and_others_may_not(
    builtin: None, make_user: Any, alice: User
) -> None:
    item = KnowledgeItem.objects.get(key="KB-003")
    assert item.source == KnowledgeSource.SHIPPED
    assert item.title_zh == "库存服务连接池耗尽（定时任务未释放连接）"
    assert item.problem_type == "resource_exhaustion"
    change = f"/admin/diagnosis_pack/knowledgeitem/{item.pk}/change/"

    operator = admin_client(alice)
    assert operator.get(change).status_code == 302  # not staff: the admin's sign-in
    viewer = admin_client(staff_with("vic", "view_knowledgeitem"))
    data = form_data(viewer.get(change).content.decode(), "knowledgeitem_form")
    data["title_en"] = "Changed by a viewer"
    assert viewer.post(change, data).status_code == 403
    item.refresh_from_db()
    assert item.title_en == ""

    editor = admin_client(staff_with("eve", "view_knowledgeitem", "change_knowledgeitem"))
    data = form_data(editor.get(change).content.decode(), "knowledgeitem_form")
    data["title_en"] = "Inventory pool exhausted by a nightly job"
    data["fix_en"] = "A pool of its own for the job"
    assert editor.post(change, data).status_code == 302
    item.refresh_from_db()
    assert item.title_en == "Inventory pool exhausted by a nightly job"
    assert "A pool of its own for the job" in item.search_text  # searched by its new words
    data["services"] = '"inventory"'  # one word, not a list: refused, nothing changed
    refused = editor.post(change, data)
    assert refused.status_code == 200 and "A list of words" in refused.content.decode()
    item.refresh_from_db()
    assert item.services == ["inventory", "inventory-db"]
    assert AuditLog.objects.filter(action="knowledge.changed").count() == 1


POOL_CONCLUSION = (
    "Stock checks time out\ndb_pool_exhausted\nslow_response\ninventory\ninventory orders\n"
    "The database connection pool of inventory is exhausted (in use >= 95% of its maximum)."
)


def _shipped_texts() -> dict[int, tuple[str, str]]:
    """The demo shop's items as the seed writes them (id -> key, search_text), unsaved."""
    shipped = {}
    for number, entry in enumerate(demo_shop().knowledge, 1):
        item = KnowledgeItem(key=entry.id, title_en=entry.title, symptoms_en=entry.content)
        item.hypothesis, item.services, item.tags = entry.hypothesis, entry.services, entry.tags
        shipped[number] = (entry.id, item.searchable())
    return shipped


@pytest.mark.parametrize("fts5", [True, False])
def test_the_embedded_sqlite_search_ranks_the_matching_item_first(fts5: bool) -> None:
    # The embedded mode's own path, over an SQLite made by the migration's statements.
    migration = importlib.import_module("packs.diagnosis.migrations.0002_knowledge_search")
    shipped = _shipped_texts()
    db = sqlite3.connect(":memory:")
    if fts5:
        db.execute(migration.SQLITE[0])
        db.executemany(
            "INSERT INTO knowledge_fts (item_id, body) VALUES (?, ?)",
            [(number, body) for number, (_, body) in shipped.items()],
        )

    def execute(sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        return list(db.execute(sql.replace("%s", "?"), params).fetchall())

    scores, strategy = embedded_scores(
        POOL_CONCLUSION, {n: body for n, (_, body) in shipped.items()}, execute
    )
    assert strategy == ("sqlite_fts5+trgm" if fts5 else "words+trgm")
    by_text = sorted(scores, key=lambda n: -(scores[n][0] + scores[n][1]))
    assert shipped[by_text[0]][0] == "KB-003"
    assert all(0 <= fts <= 1 and 0 <= trgm <= 1 for fts, trgm in scores.values())


def test_the_embedded_search_words_and_trigrams() -> None:
    # what the SQLite mode computes itself: pg_trgm's similarity, and the query's words
    assert trigram_similarity("connection pool", "connection pool") == 1.0
    assert 0 < trigram_similarity("connection pool exhausted", "pool exhausted") < 1
    assert trigram_similarity("abc", "xyz") == 0.0
    assert words("DB pool 100/100 连接池 db") == ["db", "pool", "100", "连接池"]
