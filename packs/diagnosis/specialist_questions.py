"""A specialist's own question to the reporter (seed 004's interactive sub-loop): the logs
specialist asks for the log window when the bundle names none and its logs hold no
record in the window the playbook reads (the default, before the reported time), so
reading them there would find nothing. The question names the specialist; the answer
(the first message after it) goes back to that specialist, which reads its logs over
the window the reporter gave; the orchestrator counts the message as read.

Only a specialist with a job of its own asks (waits on): its job parks on the question
and the answer wakes it (diagnosis.jobs.child_jobs). Run in the orchestrator's step
(the CLI, waits off) it reads the default window and says so."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from diagnosis.agent import waits
from diagnosis.agent.child_agents import ChildWait
from diagnosis.agent.recording import recorded
from diagnosis.agent.state import AgentContext
from diagnosis.eventlog.names import AGENT_QUESTION, USER_MESSAGE
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun, Event
from packs.diagnosis.evidence import Evidence
from packs.diagnosis.investigation import Investigation
from packs.diagnosis.steps import playbook_of, system_of

ASK_WINDOW = {
    "en": (
        "Logs specialist: the logs hold no record between {since} and {until} (they run "
        "from {first} to {last}). When did the problem happen? Answer with a time range, "
        "e.g. {example}."
    ),
    "zh": (
        "日志专家：日志在 {since} 到 {until} 之间没有记录（日志从 {first} 到 {last}）。"
        "问题发生在什么时间？请回答一个时间范围，例如 {example}。"
    ),
}
_SHOWN = "%Y-%m-%d %H:%M"


def log_span(inv: Investigation) -> tuple[datetime, datetime] | None:
    """The first and last log record's times, or None without logs."""
    if not inv.bundle.has_logs:
        return None
    source = Evidence(inv.bundle)
    try:
        row = source.con.execute("SELECT min(ts), max(ts) FROM logs").fetchone()
    finally:
        source.close()
    return (row[0], row[1]) if row and row[0] is not None else None


def window_question(inv: Investigation, language: str) -> str:
    """The logs specialist's question, or "" when it has none to ask: the bundle names
    its window, or the logs hold records in the one read, or the specialist runs in the
    orchestrator's step (no job to park)."""
    if not waits.waits_enabled() or inv.bundle.incident.window is not None:
        return ""
    span = log_span(inv)
    since, until = inv.whole.window
    if span is None or (span[1] >= since and span[0] <= until):
        return ""
    zone = since.tzinfo
    first, last = (t.astimezone(zone) for t in span)
    example = f"{(last - timedelta(minutes=50)):%H:%M}-{last:%H:%M}"
    return ASK_WINDOW["zh" if language == "zh" else "en"].format(
        since=f"{since:{_SHOWN}}",
        until=f"{until:{_SHOWN}}",
        first=f"{first:{_SHOWN}}",
        last=f"{last:{_SHOWN}}",
        example=example,
    )


def parse_window(text: str, inv: Investigation) -> dict[str, str] | None:
    """The window an answer states: two dates and times, or two times (on the day of the
    logs' last record, in the incident's zone). None when it states none."""
    zone = inv.whole.window[0].tzinfo
    full = re.findall(r"(\d{4}-\d{2}-\d{2})[ T](\d{1,2}):(\d{2})", text)
    bounds: list[datetime] = []
    if len(full) >= 2:
        for day, hour, minute in full[:2]:
            bounds.append(
                datetime.fromisoformat(f"{day}T{int(hour):02d}:{minute}").replace(tzinfo=zone)
            )
    else:
        span = log_span(inv)
        times = re.findall(r"(\d{1,2})[:：](\d{2})", text)
        if span is None or len(times) < 2:
            return None
        day = span[1].astimezone(zone).date()
        for hour, minute in times[:2]:
            if int(hour) > 23 or int(minute) > 59:
                return None
            bounds.append(
                datetime.combine(day, datetime.min.time(), zone).replace(
                    hour=int(hour), minute=int(minute)
                )
            )
    since, until = bounds
    if since >= until:
        return None
    return {"since": since.isoformat(), "until": until.isoformat()}


def _question_key(child: AgentRun) -> str:
    return f"specialist:{child.pk}"


@recorded("ask", last=True)
def specialist_ask(state: dict[str, Any], ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The question, naming the specialist, written (and committed) before it waits."""
    child = ctx.parent_run
    assert child is not None
    append_step_event(
        ctx.session_id,
        AGENT_QUESTION,
        {
            "key": _question_key(child),
            "field": "window",
            "label": "",
            "text": state["ask"],
            "specialist": state["specialist"],
            "specialist_run": child.pk,
        },
        producer=ctx.producer,
        run=run,
    )
    return {"ask": "", "asked": True, "_summary": state["ask"][:200]}


@recorded("answer")
def specialist_answer(state: dict[str, Any], ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    """The reporter's answer to this specialist's question (the first message after it),
    or the wait for it: the job parks and the answer wakes it."""
    child = ctx.parent_run
    assert child is not None
    question = (
        Event.objects.filter(
            session_id=ctx.session_id, type=AGENT_QUESTION, payload__key=_question_key(child)
        )
        .order_by("seq")
        .first()
    )
    assert question is not None  # written and committed by the ask step
    answer = (
        Event.objects.filter(session_id=ctx.session_id, type=USER_MESSAGE, seq__gt=question.seq)
        .order_by("seq")
        .first()
    )
    if answer is None:
        raise ChildWait(
            {
                "kind": "question",
                "key": question.key or _question_key(child),
                "after": question.seq,
                "purpose": "",
                "providers": [],
                "request": {},
            }
        )
    text = str(answer.payload.get("text", ""))
    inv = Investigation(
        ctx.session_id, system_of(ctx), playbook_of(ctx), state.get("problem_type") or ""
    )
    window = parse_window(text, inv)
    return {
        "window": window,
        "answer_seq": answer.seq,
        "_summary": f"window {window['since']} - {window['until']}" if window else text[:200],
    }
