"""An apron session's result as `manage.py incident run --json` prints it: its facts,
questions, risk, impact, actions with their decisions, report and event count."""

from __future__ import annotations

from typing import Any

from diagnosis.eventlog.names import AGENT_QUESTION, AGENT_QUESTION_CLOSED
from diagnosis.models import Event, Session, ToolCall
from diagnosis.reporting import decision_of


def summarize(session: Session) -> dict[str, Any]:
    """The command line's JSON of an apron session (unchanged keys and order)."""
    snapshot = session.snapshot
    fields = snapshot.get("fields", {})
    impact = snapshot.get("impact") or {}
    risk = snapshot.get("risk")
    report = getattr(session, "report", None)
    return {
        "session": str(session.pk),
        "status": session.status,
        # In the scenario's field order (jsonb keeps its own key order).
        "fields": {
            name: fields[name]
            for name in session.scenario_version.definition["field_order"]
            if name in fields
        },
        "questions": [
            e.payload["text"]
            for e in Event.objects.filter(session=session, type=AGENT_QUESTION).order_by("seq")
        ],
        # Optional questions closed without an answer (left open when every action was
        # decided, or answered without a value); not a confirmation that was not given.
        "unanswered": [
            e.payload["field"]
            for e in Event.objects.filter(session=session, type=AGENT_QUESTION_CLOSED).order_by(
                "seq"
            )
            if e.payload.get("optional", True)
        ],
        "risk": {"rule": risk["rule"], "level": risk["level"], "score": risk["score"]}
        if risk
        else None,
        "impact": {
            key: impact[key]
            for key in ("radius", "isolated_nodes", "taxiways", "runways", "stands", "flights")
        }
        if impact
        else None,
        "actions": [
            {
                "tool": c.tool_name,
                "args": c.request_payload,
                "risk_class": c.risk_class,
                "decision": decision_of(c),
                "status": c.status,
            }
            for c in ToolCall.objects.filter(session=session, is_action=True).order_by(
                "position", "id"
            )
        ],
        "report_markdown": report.markdown if report else "",
        "events": Event.objects.filter(session=session).count(),
    }
