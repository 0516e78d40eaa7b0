"""The report's chronology speaks the reader's language: statuses, compliance states,
the agent's steps, model calls and what was appended are worded, not logged codes and
English fragments; the codes auditors match on (tools, risk classes, rules) stay."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import translation

from replay.export import summarize

EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("session.status_changed", {"from": "running", "to": "waiting_user"}),
    ("fsm.transition", {"from": "FIELDS_COLLECTED", "to": "RISK_ASSESSED"}),
    ("agent.node_completed", {"node": "tool_executor"}),
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
    "running tools",
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
