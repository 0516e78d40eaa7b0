"""An apron session logged before findings were generic holds its risk and impact as
`risk.assessed` / `impact.analyzed`. The apron now writes `finding.recorded` of kind risk
and impact; the old names stay declared (read-only) so such a log still folds, replays,
renders, exports and verifies exactly like one logged now."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from diagnosis.chain import verify_chain
from diagnosis.eventlog import registry
from diagnosis.eventlog.names import FINDING_RECORDED
from diagnosis.eventlog.registry import UnknownEventType
from diagnosis.eventlog.types.findings import body
from diagnosis.events import append_event
from diagnosis.fold import fold_events
from diagnosis.models import Event, Session
from packs.airport.agent.nodes import execution
from packs.airport.findings import IMPACT_ANALYZED, LEGACY_TYPES, RISK_ASSESSED
from packs.airport.summary import summarize
from replay.export import render_export
from tests.log_helpers import assert_projections_match
from tests.web_helpers import approve_everything, login, make_session

pytestmark = pytest.mark.services

# The names the apron wrote its findings under, by the finding's kind.
OLD_NAMES = {"risk": RISK_ASSESSED, "impact": IMPACT_ANALYZED}


def write_as_the_old_apron(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent logs its findings as it did before `finding.recorded`: the finding
    (without its kind) under the kind's old name, which is writable again meanwhile."""
    for old in LEGACY_TYPES:
        monkeypatch.setitem(registry._TYPES, old.name, dataclasses.replace(old, legacy=False))
    append: Callable[..., Any] = execution.append_step_event

    def old_append(session_id: Any, type: str, payload: dict[str, Any], **kw: Any) -> Any:
        if type == FINDING_RECORDED and payload.get("kind") in OLD_NAMES:
            type, payload = OLD_NAMES[payload["kind"]], body(payload)
        return append(session_id, type, payload, **kw)

    monkeypatch.setattr(execution, "append_step_event", old_append)


def ran(user: User, approver: User) -> Session:
    session = make_session(user)
    approve_everything(session, approver)
    assert session.status == "completed"
    return session


def log(session: Session) -> list[Event]:
    return list(Event.objects.filter(session=session).order_by("seq"))


def as_logged_now(event: Event) -> Event:
    now = copy.copy(event)
    now.type, now.payload = as_now(event)
    return now


def as_now(event: Event) -> tuple[str, dict[str, Any]]:
    """An old finding event as it is written now (its type and payload)."""
    for kind, name in OLD_NAMES.items():
        if event.type == name:
            return FINDING_RECORDED, {"kind": kind, **event.payload}
    return event.type, event.payload


def test_a_log_with_the_old_finding_names_reads_as_it_did(
    builtin: None, make_user: Callable[..., User], whole_timeline_on_page: None
) -> None:
    olga, abel = make_user("olga", "operator"), make_user("abel", "approver")
    carol = make_user("carol", "auditor")
    with pytest.MonkeyPatch.context() as old_code:
        write_as_the_old_apron(old_code)
        old = ran(olga, abel)
    # The same incident again, logged now (compared up to its findings: at its approvals
    # it finds the first session's closures in force and goes another way).
    new = make_session(olga)
    old_log, new_log = log(old), log(new)
    old_types = [e.type for e in old_log]
    assert old_types.count(RISK_ASSESSED) == 1 and old_types.count(IMPACT_ANALYZED) == 1
    assert FINDING_RECORDED not in old_types
    risk_seq = old_types.index(RISK_ASSESSED) + 1
    impact_seq = old_types.index(IMPACT_ANALYZED) + 1
    # Only the findings' names differ: the same events at the same seqs, the same findings.
    assert [as_now(e)[0] for e in old_log[:impact_seq]] == [e.type for e in new_log[:impact_seq]]
    for seq in (risk_seq, impact_seq):
        assert as_now(old_log[seq - 1]) == (new_log[seq - 1].type, new_log[seq - 1].payload)

    # Appending under an old name is refused: the names are read, never written.
    with pytest.raises(UnknownEventType, match="no longer written"):
        append_event(old.pk, RISK_ASSESSED, {"level": "HIGH"}, producer="test")

    # The chain of what was written then still verifies.
    assert verify_chain(old.pk).ok

    # Fold: the log alone gives the snapshot and the rows, the same as the log would
    # give with the findings under their names of now; risk and impact as now.
    folded = assert_projections_match(old)
    now_log = [as_logged_now(e) for e in old_log]
    assert fold_events(now_log) == folded
    risk = folded.risk
    assert risk is not None and risk == new.snapshot["risk"] and risk["level"]
    assert folded.impact == new.snapshot["impact"]
    assert fold_events(old_log[: risk_seq - 1]).risk is None
    assert fold_events(old_log[:risk_seq]).risk == new.snapshot["risk"]

    # The command line's JSON reads the snapshot: the same risk and impact.
    result = summarize(old)
    assert result["risk"] == {k: new.snapshot["risk"][k] for k in ("rule", "level", "score")}
    assert result["impact"]["isolated_nodes"] == new.snapshot["impact"]["isolated_nodes"]

    # Each event reads, renders and pushes the same: summary words, timeline line, panels.
    for old_event, now in zip(old_log, now_log, strict=True):
        assert registry.summary(old_event.type, old_event.payload) == registry.summary(
            now.type, now.payload
        )
        assert registry.timeline_line(old_event.type, old_event.payload) == (
            registry.timeline_line(now.type, now.payload)
        )
        assert registry.panels(old_event.type) == registry.panels(now.type)
    risk_words = registry.summary(RISK_ASSESSED, old_log[risk_seq - 1].payload)
    assert risk["rule"] in risk_words

    # The export's chronology words the old findings like the new ones.
    exported = render_export(old, carol, masked=False)
    assert f"| `{RISK_ASSESSED}` | {risk_words} |" in exported
    assert f"`{IMPACT_ANALYZED}`" in exported and "Verified when exported" in exported

    # The session page shows the risk line under the old name, in words.
    page = login(olga).get(reverse("diagnosis:session-detail", args=[old.pk])).content.decode()
    risk_line = page.split(f'data-type="{RISK_ASSESSED}"', 1)[1].split("</li>", 1)[0]
    level = risk["level"]
    assert f'class="risk-{level.lower()}" title="{level}"' in risk_line
    assert f'title="rule {risk["rule"]}"' in risk_line
    assert f'data-type="{IMPACT_ANALYZED}"' in page

    # Replay at the old risk's seq: the state then holds the risk.
    step = login(carol).get(reverse("replay:replay-step", args=[old.pk]), {"seq": risk_seq})
    assert step.context["state"].risk == new.snapshot["risk"]
    assert 'data-testid="risk"' in step.content.decode()
