"""A session's agent tree: its AgentRun rows nested by parent, each with its elapsed
time, the tokens of its model calls and of every run below it, and, while it runs, the
tool it is running. Generic over session kinds: a job's root run with its node runs
today, an orchestrator with its specialists (and theirs) when a pack runs them.

Read in one query however many runs (tokens and the current tool are correlated
subqueries on the runs' rows), bounded by MAX_RUNS; a second query counts the runs
only when there are more than that."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.db.models import IntegerField, OuterRef, QuerySet, Subquery, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.utils import timezone

from aero.compiled import Arg, Compiled
from diagnosis.eventlog.masking import SessionMask
from diagnosis.eventlog.names import LLM_CALL
from diagnosis.models import (
    AgentRun,
    Event,
    LLMCall,
    LLMRequest,
    LLMRequestStatus,
    ToolCall,
    ToolCallStatus,
)

# Far more than a session makes (a job's run and its ~10 node runs per wait; four
# specialists each with theirs), few enough that a page and a JSON answer stay small.
MAX_RUNS = 500
# A tool call in these states is running now, under its run.
IN_PROGRESS = (ToolCallStatus.RUNNING, ToolCallStatus.EXECUTING)
# The session statuses a job may be running in: in any other, no run of it is running.
JOB_RUNS = frozenset({"queued", "running", "retrying"})


@dataclass
class RunNode:
    id: int
    parent: int | None
    agent_name: str
    mode: str
    status: str
    started_at: datetime
    ended_at: datetime | None
    elapsed: timedelta
    # This run's model calls and those of every run below it.
    tokens_in: int
    tokens_out: int
    current_tool: str | None
    output_summary: dict[str, Any]
    # The model's words in this run: the text it is streaming now (`writing`), else the
    # final text of its last model call that had one; "" when it asked no model.
    text: str = ""
    writing: bool = False
    children: list[RunNode] = field(default_factory=list)
    # Shown unfolded: a run with a run below it still running, or the newest root.
    unfolded: bool = False

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def elapsed_seconds(self) -> float:
        return round(self.elapsed.total_seconds(), 3)

    @property
    def elapsed_mark(self) -> str:
        """Where a shared render of a running run's elapsed time is filled in as of
        each request (diagnosis.page_panels): it grows while nothing else changes."""
        return f"\x00el:{self.started_at.isoformat()}\x00"


@dataclass
class AgentTree:
    roots: list[RunNode]
    total: int  # runs in the session
    limit: int

    @property
    def shown(self) -> int:
        return sum(1 for _ in self.walk())

    @property
    def truncated(self) -> bool:
        return self.total > self.limit

    @property
    def running(self) -> int:
        return sum(1 for node, _ in self.walk() if node.running)

    def walk(self) -> Iterator[tuple[RunNode, int]]:
        """Every node depth first, in start order, with its depth (roots: 0)."""
        stack = [(node, 0) for node in reversed(self.roots)]
        while stack:
            node, depth = stack.pop()
            yield node, depth
            stack.extend((child, depth + 1) for child in reversed(node.children))

    def path(self, run_id: int) -> list[int]:
        """The runs from a root down to `run_id` (empty when the tree does not hold it)."""
        trail: list[int] = []
        for node, depth in self.walk():
            del trail[depth:]
            trail.append(node.id)
            if node.id == run_id:
                return trail
        return []

    def subtree(self, run_id: int) -> list[int]:
        """The run and every run below it (empty when the tree does not hold it)."""
        for node, _ in self.walk():
            if node.id == run_id:
                return [n.id for n, _ in AgentTree([node], 0, 0).walk()]
        return []


def _sum_of(column: str) -> Subquery:
    calls = (
        LLMCall.objects.filter(agent_run=OuterRef("pk"))
        .order_by()
        .values("agent_run")
        .annotate(total=Sum(column))
        .values("total")
    )
    return Subquery(calls, output_field=IntegerField())


def read_tree(
    session_id: Any,
    mask: SessionMask | None = None,
    *,
    now: datetime | None = None,
    limit: int = MAX_RUNS,
) -> AgentTree:
    """The session's runs as a tree, for a viewer with `mask` (None: sees everything).
    A run whose parent is not among the runs read (cut by `limit`) becomes a root
    rather than disappearing."""
    rows, total = tree_rows(session_id, limit)
    return build_tree(rows, total, mask, now=now, limit=limit)


# What tree_rows reads of each run, in order.
ROW_COLUMNS = (
    "id",
    "parent_id",
    "agent_name",
    "mode",
    "status",
    "started_at",
    "ended_at",
    "output_summary",
    "used_in",
    "used_out",
    "tool",
    "streaming",
    "said",
    "session__status",
)
# One statement per limit, compiled once per connection (aero.compiled): building and
# compiling this one (five correlated subqueries) cost more than running it.
_reads: dict[int, Compiled[AgentRun]] = {}


def tree_rows(session_id: Any, limit: int = MAX_RUNS) -> tuple[list[dict[str, Any]], int]:
    """The session's runs as read for its tree (at most `limit`), and how many it has:
    everything the tree shows but the clock (diagnosis.page_panels keys on them)."""
    read = _reads.get(limit)
    if read is None:
        read = _reads.setdefault(limit, Compiled(AgentRun, lambda: _runs(limit)))
    rows = [dict(zip(ROW_COLUMNS, row, strict=True)) for row in read.rows(session_id)]
    total = len(rows)
    if total > limit:
        rows = rows[:limit]
        total = AgentRun.objects.filter(session_id=session_id).count()
    return rows, total


def _runs(limit: int) -> QuerySet[AgentRun]:
    """The runs of the session given (Arg 0) with what their nodes show."""
    current = (
        ToolCall.objects.filter(agent_run=OuterRef("pk"), status__in=IN_PROGRESS)
        .order_by("-id")
        .values("tool_name")[:1]
    )
    # The run's model text: a call streaming now (the runner's request, its text so far),
    # else the last call's final text (its llm.call event: the log, as replay reads it).
    streaming = (
        LLMRequest.objects.filter(agent_run=OuterRef("pk"), status=LLMRequestStatus.PENDING)
        .exclude(text="")
        .order_by("-id")
        .values("text")[:1]
    )
    final = (
        Event.objects.filter(run=OuterRef("pk"), type=LLM_CALL, payload__has_key="text")
        .exclude(payload__text="")
        .order_by("-seq")
        .annotate(said=KT("payload__text"))
        .values("said")[:1]
    )
    return (
        AgentRun.objects.filter(session_id=Arg(0, AgentRun._meta.get_field("session")))
        .annotate(
            used_in=Coalesce(_sum_of("tokens_in"), 0),
            used_out=Coalesce(_sum_of("tokens_out"), 0),
            tool=Subquery(current),
            streaming=Subquery(streaming),
            said=Subquery(final),
        )
        .order_by("started_at", "id")
        .values_list(*ROW_COLUMNS)[: limit + 1]
    )


def build_tree(
    rows: list[dict[str, Any]],
    total: int,
    mask: SessionMask | None = None,
    *,
    now: datetime | None = None,
    limit: int = MAX_RUNS,
) -> AgentTree:
    """The tree of `rows` (tree_rows) for a viewer with `mask`, its running runs'
    elapsed time as of `now`."""
    now = now or timezone.now()
    nodes: dict[int, RunNode] = {}
    for row in rows:
        summary = row["output_summary"] or {}
        nodes[row["id"]] = RunNode(
            id=row["id"],
            parent=row["parent_id"],
            agent_name=row["agent_name"],
            mode=row["mode"],
            status=row["status"],
            started_at=row["started_at"],
            ended_at=row["ended_at"],
            # A clock a little behind the run's start (another host) is not negative time.
            elapsed=max((row["ended_at"] or now) - row["started_at"], timedelta(0)),
            tokens_in=row["used_in"],
            tokens_out=row["used_out"],
            current_tool=row["tool"] if row["status"] == "running" else None,
            # A step's summary may quote what the viewer's mask hides.
            output_summary=mask.scrub(summary) if mask is not None else summary,
            text=_shown(row["streaming"] or row["said"] or "", mask),
            writing=bool(row["streaming"]),
        )
    roots: list[RunNode] = []
    for node in nodes.values():
        parent = nodes.get(node.parent) if node.parent is not None else None
        (parent.children if parent is not None else roots).append(node)
    tree = AgentTree(roots, total, limit)
    # Depth first reversed, every run comes after the runs below it: add them up.
    for node, _ in reversed(list(tree.walk())):
        for child in node.children:
            node.tokens_in += child.tokens_in
            node.tokens_out += child.tokens_out
            node.unfolded = node.unfolded or child.running or child.unfolded
    if rows and rows[0]["session__status"] not in JOB_RUNS:
        for root in roots:
            _end_stale_root(root, rows[0]["session__status"])
    if roots:
        roots[-1].unfolded = True
    return tree


def _shown(text: str, mask: SessionMask | None) -> str:
    """A run's model text as the viewer may see it (the hidden values replaced)."""
    return mask.text(text) if mask is not None and text else text


def _end_stale_root(root: RunNode, session_status: str) -> None:
    """A job's run still marked running while no job runs the session: the job has ended
    (its run's end is written with the lease's release, just after the session's move,
    which is what the page is pushed). Shown as the job leaves it, ended when its last
    step did."""
    if root.parent is not None or not root.running:
        return
    root.status = "failed" if session_status == "failed" else "completed"
    ends = [child.ended_at for child in root.children if child.ended_at is not None]
    root.ended_at = max(ends, default=root.started_at)
    root.elapsed = max(root.ended_at - root.started_at, timedelta(0))
    root.current_tool = None


def machine_rows(tree: AgentTree) -> list[dict[str, Any]]:
    """The tree as the machine contract's `agent_tree` (a CLI's JSON): every run depth
    first in start order, its parent by id."""
    return [
        {
            "run": node.id,
            "parent": node.parent,
            "agent": node.agent_name,
            "mode": node.mode,
            "status": node.status,
        }
        for node, _ in tree.walk()
    ]


class TreeOnce:
    """A session's tree read at its first use, then kept: the live page's context is
    built once per session and batch, and a pushed update whose events touched no run
    renders no tree (so reads none). Templates call it (a callable without arguments)."""

    def __init__(self, session_id: Any) -> None:
        self.session_id = session_id
        self.tree: AgentTree | None = None
        self.read: tuple[list[dict[str, Any]], int] | None = None

    def rows(self) -> tuple[list[dict[str, Any]], int]:
        """The runs' rows and their count (tree_rows), read once."""
        if self.read is None:
            self.read = tree_rows(self.session_id)
        return self.read

    def __call__(self) -> AgentTree:
        if self.tree is None:
            rows, total = self.rows()
            self.tree = build_tree(rows, total)
        return self.tree

    def for_mask(self, mask: SessionMask | None) -> Callable[[], AgentTree]:
        """The tree as a viewer with `mask` sees it: read once for every viewer, the
        runs' model texts masked per viewer (nothing else in it names a hidden value)."""
        if mask is None:
            return self

        def masked() -> AgentTree:
            tree = self()
            return AgentTree([_masked(root, mask) for root in tree.roots], tree.total, tree.limit)

        return masked


def _masked(node: RunNode, mask: SessionMask) -> RunNode:
    return replace(
        node,
        text=_shown(node.text, mask),
        output_summary=mask.scrub(node.output_summary),
        children=[_masked(child, mask) for child in node.children],
    )
