"""The publish-time self-check of a scenario: its actions' risk floors, then its example
cases, run by its pack (its own cases on a version, or a row-edited draft's cases
through the pack's agent, without an LLM and without writing anything). Publishing in
the admin runs it through scenarios_admin.signals.publish_check (scenarios_admin may not
import this app, so this app registers itself there in DiagnosisConfig.ready)."""

from __future__ import annotations

from typing import Any

from aero.packs import DomainPack, UnknownDomain, pack_for
from scenarios_admin.definition import below_floor, floor_message


def _pack(kind: Any) -> DomainPack | None:
    try:
        return pack_for(str(kind))
    except UnknownDomain:
        return None


def publish_check(sender: Any, definition: dict[str, Any], **kwargs: Any) -> list[str]:
    """Receiver of scenarios_admin.signals.publish_check: one line per action below its
    risk floor (validation refuses those too: publishing never trusts one check alone),
    then one line per failing case."""
    floors = [
        f"actions[{i}].risk_class: {floor_message(a['tool'], a['risk_class'])}"
        for i, a in enumerate(definition.get("actions", []))
        if below_floor(a["tool"], a["risk_class"])
    ]
    if floors:
        return floors
    pack = _pack(definition.get("kind"))
    own_check = pack.check_examples if pack is not None else None
    if own_check is not None:
        # A pack with its own example cases (the diagnosis bundles) checks them itself.
        return [
            f"example {case.number} ({case.summary()}): {'; '.join(case.problems)}"
            for case in own_check(definition)
            if not case.passed
        ]
    examples = definition.get("examples", [])
    if not examples:
        return ["no example cases: add at least one (publishing runs them as a self-check)"]
    if pack is None or pack.check_draft is None:
        # Fail closed: a published version always had its cases run.
        kind = definition.get("kind")
        return [f"the example cases cannot run: no installed pack checks kind {kind!r}"]
    try:
        cases = pack.check_draft(definition)
    except LookupError as exc:
        return [f"the example cases cannot run: {exc}"]
    return [
        f"example {case.number} ({case.text}): {'; '.join(case.problems)}"
        for case in cases
        if not case.passed
    ]
