"""The access table's masking column: every surface a read-only viewer (an auditor) can
reach, fetched as that viewer, holds none of the values the masking rule hides.

A session gets an R3 action with distinctive argument values (its runway now, the one an
approver's edit replaced), quoted by every kind of record that can repeat them: its
events and call id, a decision's reason, an agent note, the report, the audit trail.
Then each surface is fetched as the auditor and must not hold them; the same surfaces
as an operator do hold them (the seeding reaches every surface, so the test can fail).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from django.utils import timezone

from aero.models import audit
from api.consumers import Viewer, events_after
from approvals.models import Approval
from diagnosis.eventlog import names
from diagnosis.events import append_event
from diagnosis.live_render import render_updates
from diagnosis.models import Report, Session, ToolCall
from tests.api_helpers import call, token_for
from tests.web_helpers import login, waiting_session

pytestmark = pytest.mark.services

SECRET = "RWY-SECRET-77L"  # the runway the R3 action closes
BEFORE = "RWY-SECRET-09R"  # the runway an approver's edit replaced
# The session's own R2 action on the stand the operator reported: the stand is a fact of
# the session (shown as such, and a lookup's flight plan names it), but the action's
# argument, as its call id, its outbox key and its report row write it, is hidden.
STAND_PAIR = "stand=105"
HIDDEN = (SECRET, BEFORE, f"suspend_stand_operations:{STAND_PAIR}")
# The report row of that action, in Markdown or rendered.
STAND_ROW = re.compile(r"stand=105\s*(\||</td>\s*<td>)\s*R2")


def leaks(text: str) -> list[str]:
    found = [value for value in HIDDEN if value in text or json.dumps(value) in text]
    return found + [row.group() for row in STAND_ROW.finditer(text)]


def seed(session: Session, approver: User) -> Approval:
    """An approved, executed R3 closure whose arguments every kind of record repeats."""
    call_id = f"action:close_runway:runway={SECRET}"
    tool_call = ToolCall.objects.create(
        session=session,
        call_id=call_id,
        tool_name="close_runway",
        risk_class="R3",
        is_action=True,
        idempotency_key=f"{session.pk}:{call_id}",
        request_payload={"runway": SECRET},
        response_payload={
            "restriction": {"kind": "runway", "target": SECRET},
            "summary": f"Runway {SECRET} closed",
        },
        status="completed",
        decision_reason=f"{SECRET} is clear of traffic",
        decided_by=approver,
        position=99,
    )
    approval = Approval.objects.create(
        tool_call=tool_call,
        session=session,
        risk_class="R3",
        action_name="close_runway",
        status="approved",
        digest="0" * 64,
        approver=approver,
        reason=f"{SECRET} is clear of traffic",
        decided_at=timezone.now(),
        edited_by=approver,
        edited_at=timezone.now(),
        args_before_edit={"runway": BEFORE},
        edit_reason=f"not {BEFORE}: it is the active one",
    )
    base = {
        "tool_call": tool_call.pk,
        "call_id": call_id,
        "tool_name": "close_runway",
        "risk_level": "R3",
    }
    for event_type, payload in (
        (names.APPROVAL_REQUIRED, {**base, "args": {"runway": BEFORE}}),
        (
            names.APPROVAL_ARGS_EDITED,
            {**base, "args": {"runway": SECRET}, "before": {"runway": BEFORE}, "by": "bob"},
        ),
        (names.APPROVAL_APPROVED, {**base, "by": "bob", "reason": approval.reason}),
        (
            names.TOOL_CALL_COMPLETED,
            {**base, "args": {"runway": SECRET}, "response": tool_call.response_payload},
        ),
        (names.AGENT_NOTE, {"text": f"Runway {SECRET} closed; traffic moved off {BEFORE}"}),
        (names.REPORT_READY, {"markdown": f"| close_runway | runway={SECRET} | R3 |"}),
    ):
        append_event(session.pk, event_type, payload, producer="test")
    # What an analysis found names the runway too, and so does an R0 lookup's result.
    append_event(
        session.pk,
        names.FINDING_RECORDED,
        {
            "kind": "impact",
            "start": "105",
            "radius": 3,
            "isolated_nodes": ["105", "A3"],
            "taxiways": ["A"],
            "runways": [SECRET, BEFORE],
            "stands": ["105"],
            "flights": ["CA1234"],
        },
        producer="test",
    )
    lookup = ToolCall.objects.create(
        session=session,
        call_id="lookup_runway_state",
        tool_name="lookup_stand_location",
        risk_class="R0",
        idempotency_key=f"{session.pk}:lookup_runway_state",
        request_payload={"position": "105"},
        response_payload={"node_id": "105", "runway": SECRET},
        status="completed",
        position=98,
    )
    append_event(
        session.pk,
        names.TOOL_CALL_COMPLETED,
        {
            "tool_call": lookup.pk,
            "call_id": lookup.call_id,
            "tool_name": lookup.tool_name,
            "risk_level": "R0",
            "args": lookup.request_payload,
            "response": lookup.response_payload,
        },
        producer="test",
    )
    # The session's own R2 stand action, sent to its external system: its key.
    stand = ToolCall.objects.get(
        session=session, call_id=f"action:suspend_stand_operations:{STAND_PAIR}"
    )
    append_event(
        session.pk,
        names.TOOL_CALL_QUEUED,
        {
            "tool_call": stand.pk,
            "call_id": stand.call_id,
            "tool_name": stand.tool_name,
            "risk_level": "R2",
            "idempotency_key": f"{session.pk}:{stand.call_id}",
        },
        producer="test",
    )
    report = (
        f"| close_runway | runway={SECRET} | R3 |\n| suspend_stand_operations | {STAND_PAIR} | R2 |"
    )
    append_event(session.pk, names.REPORT_READY, {"markdown": report}, producer="test")
    Report.objects.update_or_create(
        session=session, defaults={"language": "en", "markdown": report}
    )
    audit(
        "approval.approved",
        obj=approval,
        actor=approver,
        session_id=session.pk,
        detail={"tool": "close_runway", "args": {"runway": SECRET}, "risk_class": "R3"},
    )
    audit(
        "approval.args_edited",
        obj=approval,
        actor=approver,
        session_id=session.pk,
        detail={"tool": "close_runway", "before": {"runway": BEFORE}, "after": {"runway": SECRET}},
    )
    return approval


def _page(name: str, **kwargs: Any) -> Callable[[User, Session, Approval], str]:
    def fetch(user: User, session: Session, approval: Approval) -> str:
        args = {k: {"session": session.pk}.get(v, v) for k, v in kwargs.items()}
        response = login(user).get(reverse(name, kwargs=args))
        assert response.status_code == 200, (name, response.status_code)
        return response.content.decode()

    return fetch


def _replay_events(user: User, session: Session, approval: Approval) -> str:
    client = login(user)
    pages = [
        client.get(reverse("replay:replay-event", args=[session.pk, seq]))
        for seq in range(1, session.last_seq + 1)
    ]
    assert all(p.status_code == 200 for p in pages)
    return "".join(p.content.decode() for p in pages)


def _replay_step(user: User, session: Session, approval: Approval) -> str:
    client = login(user)
    return "".join(
        client.get(reverse("replay:replay-step", args=[session.pk]), {"seq": seq}).content.decode()
        for seq in (session.last_seq - 2, session.last_seq)
    )


def _export(user: User, session: Session, approval: Approval) -> str:
    response = login(user).post(reverse("replay:replay-export", args=[session.pk]))
    assert response.status_code == 200
    return response.content.decode()


def _live_fragments(user: User, session: Session, approval: Approval) -> str:
    roles = frozenset(user.groups.values_list("name", flat=True))
    update = render_updates(roles, session.pk, 0, composer_key="")
    assert update is not None
    return "".join(update.frames)


def _api(user: User, session: Session, approval: Approval) -> str:
    role = user.groups.values_list("name", flat=True)[0]
    token = token_for(user, role)
    paths = [
        f"/api/v1/diagnosis-sessions/{session.pk}",
        f"/api/v1/diagnosis-sessions/{session.pk}/timeline?limit=200",
        f"/api/v1/diagnosis-sessions/{session.pk}/pending-approvals",
        f"/api/v1/approvals/{approval.pk}",
    ]
    bodies = [call("GET", path, token) for path in paths]
    export = f"/api/v1/diagnosis-sessions/{session.pk}/replay/export-md"
    bodies.append(call("POST", export, token))
    assert all(b.status_code == 200 for b in bodies), [b.status_code for b in bodies]
    hit = ""
    for hidden in (SECRET, STAND_PAIR):
        found = call("GET", f"/api/v1/history?q={hidden}", token).json()["sessions"]
        if any(s["id"] == str(session.pk) for s in found):
            hit = "found-by-a-hidden-value"
    return "".join(b.content.decode() for b in bodies) + hit


def _api_stream(user: User, session: Session, approval: Approval) -> str:
    roles = frozenset(user.groups.values_list("name", flat=True))
    return "".join(text for _, text, _ in events_after(str(session.pk), 0, Viewer(user, roles)))


def _history(user: User, session: Session, approval: Approval) -> str:
    client = login(user)
    listed = client.get(reverse("replay:history")).content.decode()
    # Searching for a hidden value (or argument) finds nothing a masked viewer could not
    # see.
    found = "".join(
        client.get(reverse("replay:history"), {"q": hidden}).content.decode()
        for hidden in (SECRET, STAND_PAIR)
    )
    assert str(session.pk) in listed
    return listed + ("found-by-a-hidden-value" if str(session.pk) in found else "")


def _audit(user: User, session: Session, approval: Approval) -> str:
    client = login(user)
    page = client.get(reverse("audit"), {"action": "approval."}).content.decode()
    csv = b"".join(client.get(reverse("audit-csv")).streaming_content).decode()  # type: ignore[attr-defined]
    return page + csv


# One column per surface an auditor can reach.
SURFACES: dict[str, Callable[[User, Session, Approval], str]] = {
    "page": _page("diagnosis:session-detail", session_id="session"),
    "live fragments": _live_fragments,
    "events list": _page("diagnosis:session-events", session_id="session"),
    "report (Markdown)": _page("diagnosis:session-report", session_id="session"),
    "replay steps (report HTML)": _replay_step,
    "replay events": _replay_events,
    "export": _export,
    "API": _api,
    "API WebSocket": _api_stream,
    "history search": _history,
    "audit page and CSV": _audit,
}


@pytest.fixture
def seeded(builtin: None, make_user: Callable[..., User]) -> tuple[Session, Approval]:
    alice = make_user("alice", "operator")
    bob = make_user("bob", "approver")
    session = waiting_session(alice)
    approval = seed(session, bob)
    session.refresh_from_db()
    return session, approval


@pytest.mark.parametrize("surface", SURFACES)
def test_an_auditor_never_sees_a_masked_value(
    surface: str, seeded: tuple[Session, Approval], make_user: Callable[..., User]
) -> None:
    session, approval = seeded
    carol = make_user("carol", "auditor")
    text = SURFACES[surface](carol, session, approval)
    leaked = leaks(text)
    assert "found-by-a-hidden-value" not in text
    assert leaked == [], f"{surface} shows {leaked} to an auditor"


@pytest.mark.parametrize(
    "surface",
    [
        "page",
        "live fragments",
        "events list",
        "report (Markdown)",
        "replay steps (report HTML)",
        "replay events",
        "export",
        "API",
        "API WebSocket",
        "audit page and CSV",
    ],
)
def test_the_values_are_there_for_an_operating_role(
    surface: str, seeded: tuple[Session, Approval], make_user: Callable[..., User]
) -> None:
    """The seeded values reach these surfaces unmasked: what the auditor's column
    checks is really there to hide."""
    session, approval = seeded
    root = make_user("root", "admin")
    text = SURFACES[surface](root, session, approval)
    assert SECRET in text
