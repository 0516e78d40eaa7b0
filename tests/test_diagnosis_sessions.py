"""IT diagnosis as a session kind: `manage.py incident run --bundle ... --json` opens a
session of the diagnosis pack, its graph records every evidence call, the conclusion and
the fix, and the fix goes through the same approvals and outbox as the airport's
actions. The shipped example bundles give exactly their expected results."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from approvals.models import Approval
from diagnosis.execution import execution_problems
from diagnosis.models import Event, ExternalEffect, Outbox, Session, ToolCall
from packs.diagnosis import slow
from packs.diagnosis.code import CodeToolError
from packs.diagnosis.fixes import fix_problems
from packs.diagnosis.storage import bundle_dir
from packs.diagnosis.system import demo_shop
from tests.bundles import ONSET, START, BundleWriter
from tools.models import McpServer

SPEC = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
EXPECTED = yaml.safe_load((SPEC / "expected.yaml").read_text("utf-8"))

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


def run_bundle(capsys: pytest.CaptureFixture[str], bundle: Path, *options: str) -> dict[str, Any]:
    capsys.readouterr()
    call_command("incident", "run", "--bundle", str(bundle), *options, "--json")
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


@pytest.mark.parametrize("mode", ["react", "plan_execute", "hierarchical"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_shipped_examples_conclude_as_expected_through_the_command(
    builtin: None, capsys: pytest.CaptureFixture[str], name: str, mode: str
) -> None:
    """In each run mode (DIAGNOSIS.md §4): every mode concludes alike."""
    expected = EXPECTED[name]
    result = run_bundle(capsys, SPEC / f"{name}.tar.gz", "--mode", mode, "--decide", "approve")

    assert (result["mode"], result["mode_source"], result["mode_switched_to"]) == (
        mode,
        "preferred",
        "",
    )
    assert result["kind"] == "diagnosis"
    assert result["status"] == "completed"
    cause = result["root_cause"]
    assert (cause["hypothesis"], cause["service"]) == (expected["hypothesis"], expected["service"])
    assert cause["deploy"] == expected.get("deploy")
    if "code_path" in expected:
        assert result["code_locations"][0] == {
            "path": expected["code_path"],
            "line": expected["code_line"],
        }
    else:
        assert result["code_locations"] == []
    action = expected["action"]
    assert [(a["tool"], a["args"]["service"], a["risk_class"]) for a in result["actions"]] == [
        (action["tool"], action["service"], action["risk_class"])
    ]
    assert result["actions"][0]["decision"] == "approved"
    assert result["actions"][0]["status"] == "completed"
    assert 0 < result["confidence"] <= 1
    # Every evidence call is listed with what it found; the conclusion cites them.
    tools = [e["tool"] for e in result["evidence"]]
    assert tools[0] == "read_bundle" and "log_signatures" in tools
    assert all(e["summary"] for e in result["evidence"])
    session = Session.objects.get(pk=result["session"])
    finding = Event.objects.filter(
        session=session, type="finding.recorded", payload__kind="root_cause"
    ).get()
    assert set(finding.payload["evidence"]) <= {e["id"] for e in result["evidence"]}
    assert finding.payload["evidence"]
    assert [c["id"] for c in result["similar_cases"]][:1] == expected["similar"]


def test_a_bad_deploy_reads_the_code_through_mcp_and_reports_it(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_bundle(capsys, SPEC / "ex-deploy-payments.tar.gz", "--decide", "reject")

    code = ToolCall.objects.get(session_id=result["session"], tool_name="code")
    assert code.status == "completed" and not code.is_action and code.risk_class == "R0"
    assert code.request_payload["path"] == "payments/app/handlers.py"
    assert code.response_payload["hunk"].startswith("@@")
    # Rejected: nothing reaches the shop-operations system, and the report says so.
    assert result["actions"][0]["decision"] == "rejected"
    assert not ExternalEffect.objects.filter(system="shop_ops").exists()
    report = Session.objects.get(pk=result["session"]).report.markdown
    assert "payments/app/handlers.py:26" in report
    # the fix by its words in the report's language (its code is no reader's word)
    assert "D-5716" in report and "回滚发布" in report and "rollback_deploy" not in report


def test_an_approved_fix_is_executed_once_by_the_shop_operations_system(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_bundle(capsys, SPEC / "ex-pool-inventory.tar.gz", "--decide", "approve")

    call = ToolCall.objects.get(session_id=result["session"], is_action=True)
    approval = Approval.objects.get(tool_call=call)
    assert approval.risk_class == "R2" and approval.status == "approved"
    effect = ExternalEffect.objects.get(idempotency_key=call.idempotency_key)
    assert (effect.system, effect.operation, effect.requests) == ("shop_ops", "restart_service", 1)
    assert effect.request["service"] == "inventory"
    assert Outbox.objects.get(tool_call=call).status == "done"
    assert call.response_payload["reference"].startswith("OPS-")


def test_without_a_decision_the_session_waits_for_the_approver(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    result = run_bundle(capsys, SPEC / "ex-upstream-cache.tar.gz")

    assert result["status"] == "waiting_user"
    assert [(a["tool"], a["risk_class"], a["status"]) for a in result["actions"]] == [
        ("open_ticket", "R1", "awaiting_approval")
    ]
    assert result["root_cause"]["service"] == "cache"


def test_a_bundle_without_evidence_asks_the_reporter_and_reports_unknown(
    builtin: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = BundleWriter(metrics=False).write(tmp_path / "empty")
    for name in ("logs.jsonl", "metrics.csv", "deploys.yaml", "config_changes.yaml"):
        (folder / name).unlink(missing_ok=True)
    shutil.rmtree(folder / "repo", ignore_errors=True)

    asked = run_bundle(capsys, folder)
    assert asked["status"] == "waiting_user"
    assert asked["root_cause"]["hypothesis"] == "unknown"
    assert "logs, metrics, changes" in asked["question"]
    assert asked["actions"] == []

    answered = run_bundle(capsys, folder, "--answer", "payments looked slow since 11:30")
    assert answered["status"] == "completed"
    assert answered["root_cause"]["hypothesis"] == "unknown"
    report = Session.objects.get(pk=answered["session"]).report.markdown
    assert "payments looked slow since 11:30" in report


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda root: (root / "incident.yaml").unlink(), "incident.yaml"),
        (
            lambda root: (root / "logs.jsonl").write_text(
                (root / "logs.jsonl").read_text() + '{"ts": "2026-10-20T11:00:00", "x": 1}\n'
            ),
            "logs.jsonl line",
        ),
        (
            lambda root: (root / "metrics.csv").write_text(
                (root / "metrics.csv").read_text() + "2026-10-20T11:00:00+08:00,orders,up,high\n"
            ),
            "metrics.csv line",
        ),
    ],
)
def test_a_bad_bundle_is_refused_with_where_and_creates_nothing(
    builtin: None, tmp_path: Path, damage: Any, named: str
) -> None:
    writer = BundleWriter()
    writer.errors("orders", "boom ({n})", first=START, count=3)
    root = writer.write(tmp_path / "bad")
    damage(root)
    sessions = Session.objects.count()

    with pytest.raises(CommandError) as refused:
        call_command("incident", "run", "--bundle", str(root), "--json")

    assert named in str(refused.value)
    assert Session.objects.count() == sessions
    assert not any(Path(bundle_dir("x")).parent.glob("*"))


def test_the_stored_bundle_is_the_sessions_own_copy(
    builtin: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    writer = BundleWriter()
    writer.errors("orders", "boom ({n})", first=ONSET, count=30)
    root = writer.write(tmp_path / "mine")
    result = run_bundle(capsys, root)
    shutil.rmtree(root)  # the reporter's folder may go: the session keeps its copy

    stored = bundle_dir(result["session"])
    assert (stored / "incident.yaml").is_file()
    assert ToolCall.objects.get(session_id=result["session"], call_id="ev-bundle").status == (
        "completed"
    )


def test_a_fix_moved_to_another_service_is_refused_where_it_executes(
    builtin: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pack's policy is checked again by the core where an action runs: an R2 fix on a
    service that is not the root cause never runs, whatever its row says."""
    result = run_bundle(capsys, SPEC / "ex-pool-inventory.tar.gz")
    call = ToolCall.objects.get(session_id=result["session"], is_action=True)
    call.status = "proposed"
    call.risk_class = "R2"
    call.request_payload = {"service": "orders"}
    assert execution_problems(call) == [
        "an R2 fix runs only on the root cause's service (inventory), not orders"
    ]


def test_a_third_party_only_gets_tickets_and_notices() -> None:
    shop = demo_shop()
    cause = {"service": "bank-api"}
    assert fix_problems("open_ticket", {"service": "bank-api"}, "R1", cause, shop) == []
    assert fix_problems("notify_owner", {"service": "bank-api"}, "R1", cause, shop) == []
    assert fix_problems("restart_service", {"service": "bank-api"}, "R2", cause, shop) == [
        "bank-api is a third party: only open_ticket or notify_owner (R1), not restart_service"
    ]
    assert fix_problems("rollback_deploy", {"service": "nowhere"}, "R2", cause, shop) == [
        "nowhere is not a service of shop",
        "an R2 fix runs only on the root cause's service (bank-api), not nowhere",
    ]


def test_a_failing_code_server_fails_its_call_not_the_session(
    builtin: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[str] = []

    def crashed(repo: Path, **kwargs: Any) -> Any:
        attempts.append(kwargs["path"])
        raise CodeToolError("the MCP server exited before it answered")

    monkeypatch.setattr(slow, "code", crashed)
    with override_settings(AERO_TOOL_RETRIES=2, AERO_TOOL_BACKOFF=0):
        result = run_bundle(capsys, SPEC / "ex-deploy-payments.tar.gz", "--decide", "approve")

    assert attempts == ["payments/app/handlers.py"] * 3  # retried per the tools' policy
    code = ToolCall.objects.get(session_id=result["session"], tool_name="code")
    assert code.status == "failed" and "MCP server exited" in code.error
    assert Event.objects.filter(session_id=result["session"], type="tool.call_failed").exists()
    # the diagnosis goes on without it, and does not cite it
    assert result["status"] == "completed"
    assert result["root_cause"]["deploy"] == "D-5716"
    finding = Event.objects.get(
        session_id=result["session"], type="finding.recorded", payload__kind="root_cause"
    )
    assert code.call_id not in finding.payload["evidence"]


def test_the_configured_code_server_crashing_fails_its_call_with_its_reason(
    builtin: None, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The git server as data, no monkeypatch: the code tool starts the configured one
    (here a server that exits at once), the call is recorded failed saying how it ended,
    and the diagnosis concludes without it."""
    server = tmp_path / "server.py"
    shutil.copy(Path(__file__).resolve().with_name("fake_mcp_server.py"), server)
    McpServer.objects.update_or_create(
        name="git", defaults={"command": "{python}", "args": [str(server), "crash", "{repo}"]}
    )
    with override_settings(AERO_TOOL_RETRIES=0):
        result = run_bundle(capsys, SPEC / "ex-deploy-payments.tar.gz", "--decide", "approve")
    code = ToolCall.objects.get(session_id=result["session"], tool_name="code")
    assert code.status == "failed"
    assert "the server failed before it answered (the server exited with code 3" in code.error
    assert result["status"] == "completed" and result["root_cause"]["deploy"] == "D-5716"
