"""Budgets that pause, not fail.

A session's model budget comes from its scenario (`budget: {steps, tokens, cost}`) or,
for what the scenario leaves unset, from the first real provider's config (admin). A
step is one reasoning step that asked the model (an `agent.note` of kind `react`, or of
kind `diagnosis_model`: a diagnosis step's choice or conclusion worded by the model);
tokens and cost are the session's totals (every model call, extraction included).

When a limit is reached before the model is asked again, the session does not fail: the
agent opens an R1 request `continue_budget` in the approval queue ("continue with N more
steps / ¥X more", with what was spent) and waits like for any approval. Approved, the
limits rise by the amounts asked (a `budget.raised` event) and the agent goes on;
rejected (or timed out), the agent stops and writes a report of what was done
(`budget.stopped`). Everything is read back from the log and the calls table, so a
re-run step finds the request it already opened instead of opening another.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from diagnosis.agent.providers import OpenAICompatibleProvider
from diagnosis.agent.state import AgentContext, AgentState
from diagnosis.eventlog.names import AGENT_NOTE, BUDGET_EXHAUSTED, BUDGET_RAISED
from diagnosis.events import append_event_once, as_logged
from diagnosis.execution import open_approval
from diagnosis.models import Event, Session, ToolCall, ToolCallStatus
from scenarios_admin.definition import BUDGET_TOOL, risk_floor

STOPPED = (ToolCallStatus.REJECTED, ToolCallStatus.TIMEOUT, ToolCallStatus.CANCELED)
# The notes of the steps that asked the model, counted against the steps budget.
MODEL_STEP_NOTES = ("react", "diagnosis_model")


@dataclass(frozen=True)
class Amounts:
    """Steps, tokens and cost; None is "no limit" (in a limit) or "not raised"."""

    steps: int | None = None
    tokens: int | None = None
    cost: Decimal | None = None

    def payload(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Decimal) else v) for k, v in asdict(self).items()}

    @classmethod
    def of(cls, payload: dict[str, Any]) -> Amounts:
        cost = payload.get("cost")
        return cls(
            steps=payload.get("steps"),
            tokens=payload.get("tokens"),
            cost=Decimal(str(cost)) if cost is not None else None,
        )

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.steps, self.tokens, self.cost))


def base_limits(definition: dict[str, Any], providers: list[OpenAICompatibleProvider]) -> Amounts:
    scenario = definition.get("budget") or {}
    config = providers[0].config if providers else None

    def pick(key: str) -> Any:
        if scenario.get(key) is not None:
            return scenario[key]
        return getattr(config, f"max_{key}", None) if config is not None else None

    cost = pick("cost")
    return Amounts(
        steps=pick("steps"),
        tokens=pick("tokens"),
        cost=Decimal(str(cost)) if cost is not None else None,
    )


def spent(session_id: Any) -> Amounts:
    steps = Event.objects.filter(
        session_id=session_id, type=AGENT_NOTE, payload__kind__in=MODEL_STEP_NOTES
    ).count()
    session = Session.objects.only("tokens_in", "tokens_out", "cost").get(pk=session_id)
    return Amounts(steps, session.tokens_in + session.tokens_out, session.cost)


def _raised(limit: Amounts, by: list[Amounts]) -> Amounts:
    def total(key: str) -> Any:
        base = getattr(limit, key)
        if base is None:
            return None
        return base + sum((getattr(b, key) or 0) for b in by)

    return Amounts(total("steps"), total("tokens"), total("cost"))


def exhausted(limit: Amounts, used: Amounts) -> list[str]:
    """Which limits are reached: the next model call would go past them."""
    return [
        key
        for key in ("steps", "tokens", "cost")
        if getattr(limit, key) is not None and getattr(used, key) >= getattr(limit, key)
    ]


def check(
    state: AgentState, ctx: AgentContext, providers: list[OpenAICompatibleProvider]
) -> dict[str, Any] | None:
    """None when the model may be asked; else the plan: wait for the continue request
    (opened here if needed) or stop (it was refused)."""
    base = base_limits(ctx.definition, providers)
    if not base:
        return None
    requests = list(
        ToolCall.objects.filter(session_id=ctx.session_id, tool_name=BUDGET_TOOL).order_by("id")
    )
    if any(r.status == ToolCallStatus.AWAITING_APPROVAL for r in requests):
        return {"step": "await"}
    if requests and requests[-1].status in STOPPED:
        return {"step": "stop", "request": requests[-1].pk}
    approved = [r for r in requests if r.status == ToolCallStatus.APPROVED]
    for request in approved:
        append_event_once(
            ctx.session_id,
            BUDGET_RAISED,
            f"budget:{request.pk}:raised",
            {
                "tool_call": request.pk,
                "by": request.decided_by.get_username() if request.decided_by else "",
                "raise": request.request_payload.get("raise", {}),
                "limits": _raised(
                    base, [Amounts.of(r.request_payload.get("raise", {})) for r in approved]
                ).payload(),
            },
            producer=ctx.producer,
            run=ctx.root_run,
        )
    limit = _raised(base, [Amounts.of(r.request_payload.get("raise", {})) for r in approved])
    used = spent(ctx.session_id)
    reached = exhausted(limit, used)
    if not reached:
        return None
    # Ask for as much again as the session started with, for every limit it has.
    ask = base
    number = len(requests) + 1
    call_id = f"budget:{number}"
    payload = {
        "exhausted": reached,
        "spent": used.payload(),
        "limits": limit.payload(),
        "raise": ask.payload(),
    }
    tool_call = ToolCall.objects.create(
        session_id=ctx.session_id,
        agent_run=ctx.root_run,
        call_id=call_id,
        idempotency_key=f"{ctx.session_id}:{call_id}",
        tool_name=BUDGET_TOOL,
        risk_class=risk_floor(BUDGET_TOOL),
        # Not a response action: nothing outside AERO runs, the report does not list it.
        is_action=False,
        request_payload=payload,
        status=ToolCallStatus.AWAITING_APPROVAL,
    )
    append_event_once(
        ctx.session_id,
        BUDGET_EXHAUSTED,
        f"budget:{number}:exhausted",
        {"tool_call": tool_call.pk, **payload},
        producer=ctx.producer,
        run=ctx.root_run,
    )
    # Digested against the session as the log will read once this step group commits:
    # the risk or impact this job assessed is queued, not written yet.
    tool_call.session = as_logged(Session.objects.get(pk=ctx.session_id))
    open_approval(tool_call, producer=ctx.producer, run=ctx.root_run, fresh=True)
    return {"step": "await"}


def stop_reason(request_pk: int) -> tuple[str, str, str]:
    """(outcome, by, reason) of the refused continue request."""
    call = ToolCall.objects.select_related("decided_by").get(pk=request_pk)
    by = call.decided_by.get_username() if call.decided_by else "system"
    return str(call.status), by, call.decision_reason
