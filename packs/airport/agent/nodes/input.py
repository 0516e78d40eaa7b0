"""The input parser: the operator's new messages read into the incident's fields."""

from __future__ import annotations

from typing import Any

from aero.compiled import Arg, Compiled
from diagnosis.agent import summaries, waits
from diagnosis.agent.fallback import call_with_fallback
from diagnosis.agent.providers import Provider
from diagnosis.agent.reading import Extraction
from diagnosis.agent.recording import call_recorder, fallback_recorder, recorded, skip_recorder
from diagnosis.agent.state import AgentContext
from diagnosis.agent.usage import Usage
from diagnosis.eventlog.names import FIELDS_EXTRACTED, USER_MESSAGE
from diagnosis.events import append_step_event
from diagnosis.models import AgentRun, Event
from packs.airport.agent import grounding, policy
from packs.airport.agent.extraction import is_unsure
from packs.airport.agent.nodes.reasoning import close_question
from packs.airport.agent.state import ApronState

# The operator's messages after the last one read: compiled once per connection.
_messages_after = Compiled(
    Event,
    lambda: Event.objects.filter(
        session_id=Arg(0, Event._meta.get_field("session")),
        type=USER_MESSAGE,
        seq__gt=Arg(1, Event._meta.get_field("seq")),
    ).order_by("seq"),
)


@recorded("input_parser")
def input_parser(state: ApronState, ctx: AgentContext, run: AgentRun) -> dict[str, Any]:
    definition = ctx.definition
    fields = dict(state.get("fields") or {})
    evidence = dict(state.get("evidence") or {})
    consumed = state.get("consumed_seq", 0)
    asked = (state.get("question") or {}).get("field")
    messages = list(_messages_after.rows(ctx.session_id, consumed))
    pending = dict(state.get("unconfirmed") or {})
    declined = {name: list(values) for name, values in (state.get("declined") or {}).items()}
    dropped: dict[str, Any] = {}  # a model's values the operator's words contradict
    changed: dict[str, Any] = {}
    unconfirmed: dict[str, Any] = {}
    # The field whose pending value the operator is answering about: a yes settles it.
    confirming = asked if asked in pending else None
    only_corrections = False
    unsure = False
    for message in messages:
        text = message.payload.get("text", "")
        correction = message.payload.get("correction")
        if correction and correction.get("field") in definition["fields"]:
            # The operator corrected a fact: taken as said, no extraction, no question.
            name = correction["field"]
            fields[name] = correction["value"]
            evidence[name] = f"corrected by {message.payload.get('author', 'the operator')}"
            changed[name] = correction["value"]
            pending.pop(name, None)
            consumed = message.seq
            only_corrections = True
            unsure = False  # a correction says nothing about not knowing
            continue
        only_corrections = False

        def extract(provider: Provider, text: str = text) -> tuple[dict[str, Extraction], Usage]:
            return provider.extract(definition, text, ctx.graph, asked)

        # Keyed by the message, not by the call's place in this step: the session's
        # creation records the opening message's request under the same key.
        with waits.call_key(waits.extraction_key(ctx.session_id, message.seq)):
            found = call_with_fallback(
                ctx.providers,
                "extract",
                extract,
                call_recorder(ctx, run),
                fallback_recorder(ctx, run),
                skip_recorder(ctx, run),
            )
        for name, extraction in grounding.settle(definition, found, pending, asked, text, declined):
            if extraction.dropped is not None:
                dropped[name] = {"value": extraction.dropped, "kept": extraction.value}
            known = fields.get(name)
            if (
                extraction.confirmed
                and name != confirming
                and known is not None
                and evidence.get(name) != "default"
                and extraction.value != known
            ):
                # Another value for a known field (a second tab, a slip): the operator
                # confirms the change first; nothing is taken or dropped unseen.
                pending[name] = {
                    "value": extraction.value,
                    "evidence": extraction.evidence,
                    "replaces": known,
                }
                unconfirmed[name] = pending[name]
            elif extraction.confirmed:
                fields[name] = extraction.value
                evidence[name] = extraction.evidence
                changed[name] = extraction.value
                pending.pop(name, None)
            elif fields.get(name) is None:
                # Read without evidence of its own: the operator confirms it first.
                pending[name] = {"value": extraction.value, "evidence": extraction.evidence}
                unconfirmed[name] = pending[name]
        consumed = message.seq
        unsure = bool(asked) and asked not in changed and is_unsure(text)
    close_question_not_settled(state, ctx, run, messages, changed, pending, unsure)
    for name, spec in definition["fields"].items():
        if fields.get(name) is None and spec.get("default") is not None:
            fields[name] = spec["default"]
            evidence[name] = "default"
            changed[name] = spec["default"]
    missing = policy.missing_p1(definition, fields)
    replan = replan_after_correction(state, definition, changed, evidence) or replan_after_answer(
        state, ctx, fields, changed, evidence
    )
    append_step_event(
        ctx.session_id,
        FIELDS_EXTRACTED,
        {
            "changed": changed,
            "evidence": {k: evidence[k] for k in changed},
            "missing": missing,
            "unconfirmed": unconfirmed,  # read in these messages, to be confirmed
            "pending": pending,  # every value awaiting the operator's confirmation
            # A model's values the operator's words contradict: not taken (field -> the
            # model's value and the one the words state).
            **({"dropped": dropped} if dropped else {}),
            # Values put to the operator and not confirmed: not put again unless the
            # operator's own words state them.
            **({"declined": declined} if declined != (state.get("declined") or {}) else {}),
            "through_seq": consumed,
        },
        producer=ctx.producer,
        run=run,
    )
    summary = summaries.fields_recognised(len(changed), missing)
    return {
        "fields": fields,
        "evidence": evidence,
        "consumed_seq": consumed,
        "question": None,
        "unconfirmed": pending,
        "declined": declined,
        "only_corrections": only_corrections,
        "unsure": unsure,
        "new_input": False,
        **replan,
        "_summary": summary,
    }


def close_question_not_settled(
    state: ApronState,
    ctx: AgentContext,
    run: AgentRun,
    messages: Any,
    changed: dict[str, Any],
    pending: dict[str, Any],
    unsure: bool,
) -> None:
    """The messages answered the open question without settling its field: an optional
    question is asked once and the response goes on without it; a confirmation of an
    inferred value ("please confirm ... from ...") answered with anything but a yes drops
    the value (asked plainly next, when it is required). Either way the question closes,
    and the log says why: the operator does not know, sent a correction instead, said
    no, or named no value."""
    question = state.get("question") or {}
    field = question.get("field")
    answering = [m for m in messages if m.payload.get("answers") == question.get("key")]
    if not field or not answering or field in changed:
        return
    optional = bool(question.get("optional"))
    was_confirmation = field in (state.get("unconfirmed") or {}) and field not in pending
    if not (optional or was_confirmation):
        return
    last = answering[-1].payload
    if last.get("correction"):
        reason = "correction"
    elif unsure:
        reason = "unsure"
    elif was_confirmation:
        reason = "declined"
    else:
        reason = "unrecognised"
    close_question(
        ctx, run, question, state.get("language", "en"), reason=reason, optional=optional
    )


def replan_after_answer(
    state: ApronState,
    ctx: AgentContext,
    fields: dict[str, Any],
    changed: dict[str, Any],
    evidence: dict[str, str],
) -> dict[str, Any]:
    """An optional fact answered after the risk was assessed (it is asked alongside the
    approvals): the rules run again, and when it changes the rule that matches or the
    actions it calls for (a higher rule: fire standby, a closure), the proposals are made
    again as revision n and the open ones are superseded. An answer that changes neither
    leaves the approvals open: nothing to decide twice."""
    definition = ctx.definition
    risk = state.get("risk")
    impact = state.get("impact")
    before = state.get("fields") or {}
    answered = {
        name: value
        for name, value in changed.items()
        if definition["fields"][name]["priority"] == "P2"
        and value is not None
        and evidence.get(name) != "default"
        and before.get(name) != value
    }
    if not risk or not answered:
        return {}
    new = policy.with_defaults(definition, fields)
    new_risk = policy.assess_risk(definition, new, ctx.graph)
    if new_risk["rule"] == risk.get("rule") and state.get("actions_planned") and impact:
        old = policy.with_defaults(definition, before)
        wanted = [
            (c["call_id"], c["args"])
            for c in policy.required_actions(definition, new, ctx.graph, risk, impact)
        ]
        had = [
            (c["call_id"], c["args"])
            for c in policy.required_actions(definition, old, ctx.graph, risk, impact)
        ]
        if wanted == had:
            return {}
    return {
        "risk": None,
        "impact": None,
        "actions_planned": False,
        "revision": int(state.get("revision") or 0) + 1,
        "replanning": {"previous_risk": risk, "corrected": {}, "answered": answered},
    }


def replan_after_correction(
    state: ApronState, definition: dict[str, Any], changed: dict[str, Any], evidence: dict[str, str]
) -> dict[str, Any]:
    """A fact corrected after the risk was assessed (with the correction form, or a typed
    change the operator confirmed): the risk, the impact and the proposals no longer
    stand. They are cleared so the planner runs the rules again (and the lookups, when
    the flight or the position changed); the proposals made next are revision n, and
    what was open before is withdrawn then (tool_executor)."""
    risk = state.get("risk")
    before = state.get("fields") or {}
    # Through the correction form, or typed: a required fact known before that the
    # operator then confirmed changing ("是" to "you now said B3, but it was B2").
    corrected = {
        name: value
        for name, value in changed.items()
        if before.get(name) != value
        and (
            evidence.get(name, "").startswith("corrected by")
            or (before.get(name) is not None and definition["fields"][name]["priority"] == "P1")
        )
    }
    if not risk or not corrected:
        return {}
    lookups_from = {definition["impact"]["start"]} | {
        n for n, spec in definition["fields"].items() if spec["type"] == "flight_no"
    }
    update: dict[str, Any] = {
        "risk": None,
        "impact": None,
        "actions_planned": False,
        "revision": int(state.get("revision") or 0) + 1,
        "replanning": {"previous_risk": risk, "corrected": corrected},
    }
    if lookups_from & set(corrected):
        update["enrichment"] = None
    return update
