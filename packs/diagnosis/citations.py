"""A conclusion stands on the tool results of its own session: every id it cites must be
an evidence call of this session that answered. An id from elsewhere (another session,
an invented one, a call that failed) is dropped; a conclusion left citing nothing is not
reported: it becomes "no root cause named" and the reporter is asked. Each correction
is an `fsm.violation` event (a compliance violation) on the timeline. Whoever wrote the
conclusion (the playbook, a model wording it) goes through this check."""

from __future__ import annotations

from typing import Any

from diagnosis.models import ToolCall, ToolCallStatus
from packs.diagnosis.playbook_data import Playbook

# The intake's read of the bundle's inventory: a result, but it names no cause.
INVENTORY = "ev-bundle"
FOREIGN = "foreign_evidence"
UNCITED = "uncited_conclusion"


def session_results(session_id: Any) -> set[str]:
    """The ids of this session's evidence calls that answered (one query)."""
    return set(
        ToolCall.objects.filter(
            session_id=session_id, is_action=False, status=ToolCallStatus.COMPLETED
        ).values_list("call_id", flat=True)
    )


def checked(
    found: dict[str, Any], cited: list[str], results: set[str], playbook: Playbook
) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]]:
    """(the conclusion to record, the ids it cites, the violations): ids not among
    `results` dropped; a named root cause citing none of them (but the inventory)
    replaced by the playbook's "unknown" conclusion (no fix, no candidates)."""
    violations: list[dict[str, Any]] = []
    foreign = [i for i in cited if i not in results]
    kept = [i for i in cited if i in results]
    if foreign:
        violations.append(
            {
                "kind": FOREIGN,
                "ids": foreign,
                "violation": "the conclusion cited evidence that is not a tool result of "
                f"this session: {', '.join(foreign)}; dropped",
            }
        )
    if set(kept) - {INVENTORY} or found["hypothesis"] == "unknown":
        return found, kept, violations
    violations.append(
        {
            "kind": UNCITED,
            "hypothesis": found["hypothesis"],
            "service": found.get("service") or "",
            "violation": f"the conclusion {found['hypothesis']} ({found.get('service')}) "
            "cited no tool result of this session; not reported",
        }
    )
    missing = [*found.get("missing", []), "evidence"]
    text = playbook.hypotheses["unknown"].text if "unknown" in playbook.hypotheses else {}
    corrected = {
        **found,
        "hypothesis": "unknown",
        "service": None,
        "service_kind": "",
        "deploy": None,
        "config_key": None,
        "summary": {k: v.format(missing=", ".join(missing)) for k, v in text.items()},
        "confidence": 0.0,
        "related_services": [],
        "code_locations": [],
        "candidates": [],
        "missing": missing,
        "action": None,
    }
    return corrected, kept, violations
