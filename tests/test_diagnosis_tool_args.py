"""Each evidence tool of DIAGNOSIS.md §2 has a pydantic argument model declared once in
the pack; a call is validated when it runs, and a bad argument is a recorded failed call
with a message naming the argument (the diagnosis goes on), never a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings

from aero.packs import pack_for
from diagnosis.agent.tools import ToolContext
from diagnosis.models import Session, ToolCall, ToolCallStatus
from packs.diagnosis.investigation import Investigation
from packs.diagnosis.playbook_data import default_playbook
from packs.diagnosis.sessions import start_from_bundle
from packs.diagnosis.system import demo_shop

EXAMPLES = Path(__file__).resolve().parent.parent / "packs" / "diagnosis" / "data" / "examples"
SECTION_2 = {
    "log_search",
    "log_signatures",
    "metric_query",
    "anomalies",
    "deploys",
    "config_changes",
    "code",
    "similar_cases",
    "topology",
    # a system repository's commits, read through its MCP git server (issue 36)
    "commits",
}

pytestmark = pytest.mark.services


@pytest.fixture(autouse=True)
def _bundles_in_tmp(tmp_path: Path) -> Any:
    with override_settings(AERO_BUNDLE_DIR=tmp_path / "stored"):
        yield


@pytest.fixture
def diagnosed(builtin: None, alice: User) -> Session:
    return start_from_bundle(alice, EXAMPLES / "ex-deploy-payments.tar.gz", {})


def run(session: Session, call_id: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    shop: Any = demo_shop()  # the step's world, as the diagnosis graph's context holds it
    inv = Investigation(session.pk, shop, default_playbook(), "")
    item, response = inv.run(
        ToolContext(session.pk, shop, None, "test"),
        {"call_id": call_id, "tool": tool, "args": args, "position": 90},
    )
    return {**item, "response": response}


def test_every_evidence_tool_declares_its_arguments_in_the_pack() -> None:
    declared = pack_for("diagnosis").tools.evidence_args
    assert set(declared) == SECTION_2
    for tool, model in declared.items():
        schema = model.model_json_schema()
        assert schema["type"] == "object" and schema.get("additionalProperties") is False, tool


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("metric_query", {"service": "payments"}, "metric: Field required"),
        ("log_search", {"limit": 0}, "limit: Input should be greater than or equal to 1"),
        ("log_search", {"level": "LOUD"}, "level: Input should be"),
        ("code", {"commit": "-rf1234", "path": "a.py", "line": 3}, "commit: String should match"),
        ("code", {"commit": "abcdef1", "path": "../../etc/passwd", "line": 3}, "without '..'"),
        ("topology", {"service": ""}, "service: String should have at least 1 character"),
        ("similar_cases", {"text": "x", "extra": 1}, "extra: Extra inputs are not permitted"),
        (
            "deploys",
            {"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
            "since is after until",
        ),
        ("anomalies", {"since": "yesterday", "until": "today"}, "since: Input should be"),
    ],
)
def test_a_bad_argument_is_a_recorded_failed_call_naming_it(
    diagnosed: Session, tool: str, args: dict[str, Any], message: str
) -> None:
    item = run(diagnosed, f"ev-bad-{tool}", tool, args)
    assert item["error"].startswith(f"bad arguments for {tool}: ")
    assert message in item["error"]
    assert item["new"] is False and item["response"] == {}
    recorded = ToolCall.objects.get(session=diagnosed, call_id=f"ev-bad-{tool}")
    assert recorded.status == ToolCallStatus.FAILED and recorded.error == item["error"]


def test_log_search_and_metric_query_read_the_bundle(diagnosed: Session) -> None:
    lines = run(diagnosed, "ev-x-log", "log_search", {"service": "payments", "level": "ERROR"})
    assert not lines["error"], lines["error"]
    found = lines["response"]["lines"]
    assert found and all(
        line["service"] == "payments" and line["level"] == "ERROR" for line in found
    )
    assert len(found) <= 20  # the default limit
    anomalies = ToolCall.objects.get(session=diagnosed, call_id="ev-anomalies").response_payload
    first = anomalies["anomalies"][0]
    assert first["metric"] != "log_errors_per_minute"
    series = run(
        diagnosed,
        "ev-x-metric",
        "metric_query",
        {"service": first["service"], "metric": first["metric"]},
    )
    assert not series["error"], series["error"]
    assert series["response"]["samples"] > 0
    assert max(v for _, v in series["response"]["series"]) >= first["peak"]
