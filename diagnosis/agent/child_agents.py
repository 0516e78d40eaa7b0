"""Child agents are waits: an agent that splits its work among child agents (the IT
pack's orchestrator and its specialists) waits for them as it waits for the model
(docs/model-calls.md), through the same rows and the same reconciler.

A node calls `wait_for_children(ctx, kind, children)`. With waits on (AERO_LLM_WAITS):

- each child is an `LLMRequest` row keyed `child:<join>:<name>` (`request`: {"child":
  kind, "join": join, "args": ...}); the node raises `ChildWait` (a `ModelWait`), the job
  records the rows (fenced by its lease), enqueues one child job per row and ends. No
  worker waits for another agent;
- a child job (diagnosis.jobs.child_jobs) claims its row (the claim is its lease, renewed
  by the process's lease keeper, fencing every write it makes), runs the pack's child
  agent, and stores its result; the last child of the join to finish enqueues the
  parent's session (under the session's row lock: exactly one sees none pending), and
  the reconciler enqueues it if that enqueue was lost;
- answered (every row done or failed): the node re-runs and reads the results.

A child may itself wait (a slow tool, the model, a question to the reporter): its job
records that wait on its row and ends; whatever answers it enqueues the session, whose
job wakes the children that can go on. Without waits (the inline backend, the CLI) the
children run here, in the node, one after the other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from diagnosis.agent import waits
from diagnosis.agent.state import AgentContext
from diagnosis.models import AgentRun, LLMRequest, LLMRequestStatus

WAIT_KIND = "children"
# A child request's purpose starts with this (the LLM runner claims none of them).
PURPOSE_PREFIX = "child:"


@dataclass(frozen=True)
class Child:
    """One child of a join: its name (unique in the join) and its arguments (JSON)."""

    name: str
    args: dict[str, Any]


# A pack's child agent: runs the child under `ctx` (its steps record under the parent
# run), `key` its row's key (the child's own runs and events are keyed by it), and
# returns its result (JSON). It may raise a `ModelWait` (a slow tool, the model, a
# question): the job parks it until that is answered and runs it again from the start.
ChildRunner = Callable[[AgentContext, str, dict[str, Any]], dict[str, Any]]

_RUNNERS: dict[str, ChildRunner] = {}


def register_child_agent(kind: str, run: ChildRunner) -> None:
    """Declare a pack's child agent (AppConfig.ready(); registering again replaces it)."""
    _RUNNERS[kind] = run


def child_runner(kind: str) -> ChildRunner:
    return _RUNNERS[kind]


def child_key(join: str, name: str) -> str:
    return f"{PURPOSE_PREFIX}{join}:{name}"


class ChildWait(waits.ModelWait):
    """The node waits for its children: handled like a model wait."""


def wait_for_children(
    ctx: AgentContext, kind: str, join: str, children: list[Child], parent: AgentRun
) -> dict[str, dict[str, Any]]:
    """Each child's result by name (in `children`' order), their runs made under
    `parent`. `join` names this wait (the same for a re-run of the node). With waits on:
    the stored results, or ChildWait until every child has one; otherwise each child runs
    here."""
    run = child_runner(kind)
    if not waits.waits_enabled():
        under = replace(ctx, parent_run=parent)
        return {c.name: run(under, child_key(join, c.name), c.args) for c in children}
    keys = {c.name: child_key(join, c.name) for c in children}
    rows = {
        row.key: row
        for row in LLMRequest.objects.filter(key__in=list(keys.values())).only(
            "key", "status", "reply", "error"
        )
    }
    found = [rows.get(keys[c.name]) for c in children]
    if all(row is not None and row.status != LLMRequestStatus.PENDING for row in found):
        return {
            c.name: _result(row) for c, row in zip(children, found, strict=True) if row is not None
        }
    raise ChildWait(
        {
            "kind": WAIT_KIND,
            "key": join,
            "purpose": f"{PURPOSE_PREFIX}{kind}"[:32],
            "providers": [],
            "children": [
                {
                    "key": keys[c.name],
                    "purpose": f"{PURPOSE_PREFIX}{kind}"[:32],
                    "request": {
                        "child": kind,
                        "join": join,
                        "name": c.name,
                        "parent": parent.pk,
                        "args": c.args,
                    },
                }
                for c in children
            ],
        }
    )


def _result(row: LLMRequest) -> dict[str, Any]:
    if row.status == LLMRequestStatus.DONE:
        return dict((row.reply or {}).get("result") or {})
    return {"failed": row.error or "the child agent failed"}
