"""Request and response bodies of /api/v1 (the OpenAPI schema is generated from these)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from ninja import Field, Schema
from pydantic import ConfigDict, StringConstraints

from aero.text import MAX_MESSAGE, MAX_REASON


class StrictIn(Schema):
    """A request body: an unknown field is refused (422), not ignored."""

    model_config = ConfigDict(extra="forbid")


NO_NUL = r"^[^\x00]*$"  # PostgreSQL cannot store U+0000 in text
SLUG = r"^[-a-zA-Z0-9_]+$"
# What the strip below removes (pydantic-core trims Unicode White_Space), spelled out: the
# schema's `\S` would differ between ECMA, Python and Rust regexes (U+001C, U+0085, U+FEFF).
SPACE = r"\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# No NUL, and a character that is not a space: "   " is refused, and the schema says so.
HAS_TEXT = rf"^[^\x00]*[^\x00{SPACE}][^\x00]*$"
Text = Annotated[
    str,
    StringConstraints(
        strip_whitespace=True, min_length=1, max_length=MAX_MESSAGE, pattern=HAS_TEXT
    ),
]
Reason = Annotated[
    str, StringConstraints(strip_whitespace=True, max_length=MAX_REASON, pattern=NO_NUL)
]


class SessionIn(StrictIn):
    problem_type: str = Field(
        ...,
        max_length=64,
        pattern=SLUG,
        description="Scenario slug, e.g. oil_spill.",
        examples=["oil_spill"],
    )
    description: Text = Field(..., description="The incident as a person would report it.")


class SessionCreated(Schema):
    session_id: UUID
    status: str


class SessionOut(Schema):
    id: UUID
    title: str
    status: str
    problem_type: str
    scenario_version: int
    language: str
    created_by: str
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    last_seq: int
    snapshot: dict[str, Any] = Field(
        ..., description="What the agent knows: fields, evidence, risk, impact, question, fsm."
    )
    tokens_in: int
    tokens_out: int
    tokens_estimated: bool = Field(
        ...,
        description="Some calls' provider reported no usage: their tokens (and cost) are "
        "AERO's estimate.",
    )
    cost: str = Field(..., description="LLM cost so far, as a decimal string.")
    open_approvals: int
    has_report: bool
    report: dict[str, Any] | None = Field(
        None,
        description="The pack's report fields, if it has them. An IT diagnosis: "
        "root_cause_md, fix_suggestion_md, confidence_score, related_services, "
        "code_locations [{path, line}], similar_cases [{id, title, score, strategy}] "
        "(best first); empty before the conclusion.",
    )


class SessionSummary(Schema):
    id: UUID
    title: str
    status: str
    problem_type: str
    created_by: str
    created_at: datetime
    ended_at: datetime | None
    last_seq: int


NEXT_CURSOR = "Pass as `cursor` for the next page; null when this page is the last."


class SessionPage(Schema):
    sessions: list[SessionSummary]
    next_cursor: str | None = Field(..., description=NEXT_CURSOR)


class CancelIn(StrictIn):
    reason: Reason = ""


class AnswerIn(StrictIn):
    message: Text


class Envelope(Schema):
    event_id: UUID
    session_id: UUID
    type: str
    ts: datetime
    seq: int
    payload: dict[str, Any]


class TimelineOut(Schema):
    session_id: UUID
    last_seq: int
    events: list[Envelope]
    next_cursor: str | None = Field(..., description=NEXT_CURSOR)


class RunNode(Schema):
    id: int
    parent: int | None = Field(..., description="The run this one runs under (none: a root).")
    agent_name: str
    mode: str
    status: str
    started_at: datetime
    ended_at: datetime | None
    elapsed_seconds: float = Field(..., description="Until its end, or until now while running.")
    tokens_in: int = Field(..., description="Its model calls' and those of every run below it.")
    tokens_out: int = Field(..., description="As tokens_in.")
    current_tool: str | None = Field(
        ..., description="The tool it is running now (only while the run is running)."
    )
    output_summary: dict[str, Any] = Field(
        ..., description="What the run reported when it ended (masked as the timeline is)."
    )
    text: str = Field(
        ...,
        description="The model's words in this run: the text it is streaming now, else its "
        "last model call's final text; empty when it asked no model (masked).",
    )
    writing: bool = Field(..., description="`text` is a model call streaming now.")
    children: list[RunNode]


class AgentTreeOut(Schema):
    session_id: UUID
    runs: list[RunNode] = Field(..., description="The root runs, each with its runs below it.")
    total_runs: int
    truncated: bool = Field(
        ...,
        description="The session has more runs than `limit`: the first `limit` by start time "
        "are shown (one whose parent is cut becomes a root).",
    )
    limit: int


class ApprovalEditOut(Schema):
    by: str | None
    at: datetime
    args_before: dict[str, Any] | Literal["masked"] = Field(
        ..., description="The arguments before this change (masked as `args` is)."
    )
    reason: str


class ApprovalOut(Schema):
    id: int
    session_id: UUID
    tool_call_id: int
    action: str
    args: dict[str, Any] | Literal["masked"] = Field(
        ..., description='"masked" for read-only viewers when the replay mask policy hides it.'
    )
    risk_class: Literal["R1", "R2", "R3"]
    status: str
    digest: str = Field(
        ..., description="Send it back with the decision: it binds the decision to this request."
    )
    next_step: Literal["approve", "confirm", "none"]
    created_at: datetime
    deadline: datetime | None
    first_approved_by: str | None
    approver: str | None
    reason: str
    edited: ApprovalEditOut | None = Field(
        ...,
        description="The latest change of the arguments by an approver (null if none): what"
        " is decided is then not what the agent proposed.",
    )


class DecisionIn(StrictIn):
    digest: str = Field(..., min_length=64, max_length=64, pattern="^[0-9a-f]{64}$")
    reason: Reason = ""


class RejectIn(StrictIn):
    digest: str = Field(..., min_length=64, max_length=64, pattern="^[0-9a-f]{64}$")
    reason: Annotated[
        str,
        StringConstraints(
            strip_whitespace=True, min_length=1, max_length=MAX_REASON, pattern=NO_NUL
        ),
    ]
