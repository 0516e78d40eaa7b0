"""Background jobs. A job advances one session until the graph ends or interrupts, then
returns: it never waits for a human. One job at a time per session (a lease row in the
database, renewed by the job's heartbeat and fencing every write the job makes);
a decision or an answer enqueues another job that resumes the graph.

By concern, dependencies pointing down the list:
- `enqueue`: dispatch on commit, the rq queue, the backends (rq, embedded, inline);
- `reconciler`: re-enqueue the sessions that should move and have no job;
- `embedded`: the in-process worker (job threads and the periodic tasks);
- `job`: the job itself (`advance_session`);
- `model_requests`: the model calls a job waits for, recorded and read;
- `checkpoints`: the compiled graph, its fenced checkpointer and the checkpoint sweeps;
- `lease`: the lease statement, the heartbeat and the release;
- `world`: what a job loads to start (the definition, the world and its stamp).

The LLM runner (diagnosis.llm_runner) imports none of these: it is handed
`dispatch_after_commit` by whoever starts it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diagnosis.jobs.checkpoints import (
        agent_graph,
        close_agent_runtime,
        delete_ended_checkpoints,
        prune_waiting_checkpoints,
    )
    from diagnosis.jobs.enqueue import (
        dispatch,
        dispatch_after_commit,
        drop_job,
        embedded_worker,
        enqueue_advance,
        job_id,
        queued_job_ids,
        running_embedded_worker,
    )
    from diagnosis.jobs.job import WAITING_MODEL, advance_session, warm_up_worker
    from diagnosis.jobs.lease import lease_is_live
    from diagnosis.jobs.model_requests import request_opening_extraction
    from diagnosis.jobs.reconciler import (
        close_orphaned_runs,
        requeue_stalled_sessions,
        resume_failed_sessions,
        stalled_sessions,
    )

# Each name is imported from its module when first used: importing the package (every
# web process does, through diagnosis.actions) no longer imports LangGraph, which only a
# job and the checkpoint sweeps need (~1.3 s of CPU at each process start).
_MODULES = {
    "WAITING_MODEL": "diagnosis.jobs.job",
    "advance_session": "diagnosis.jobs.job",
    "agent_graph": "diagnosis.jobs.checkpoints",
    "close_agent_runtime": "diagnosis.jobs.checkpoints",
    "close_orphaned_runs": "diagnosis.jobs.reconciler",
    "delete_ended_checkpoints": "diagnosis.jobs.checkpoints",
    "dispatch": "diagnosis.jobs.enqueue",
    "dispatch_after_commit": "diagnosis.jobs.enqueue",
    "drop_job": "diagnosis.jobs.enqueue",
    "embedded_worker": "diagnosis.jobs.enqueue",
    "enqueue_advance": "diagnosis.jobs.enqueue",
    "job_id": "diagnosis.jobs.enqueue",
    "lease_is_live": "diagnosis.jobs.lease",
    "prune_waiting_checkpoints": "diagnosis.jobs.checkpoints",
    "queued_job_ids": "diagnosis.jobs.enqueue",
    "request_opening_extraction": "diagnosis.jobs.model_requests",
    "requeue_stalled_sessions": "diagnosis.jobs.reconciler",
    "resume_failed_sessions": "diagnosis.jobs.reconciler",
    "running_embedded_worker": "diagnosis.jobs.enqueue",
    "stalled_sessions": "diagnosis.jobs.reconciler",
    "warm_up_worker": "diagnosis.jobs.job",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "WAITING_MODEL",
    "advance_session",
    "agent_graph",
    "close_agent_runtime",
    "close_orphaned_runs",
    "delete_ended_checkpoints",
    "dispatch",
    "dispatch_after_commit",
    "drop_job",
    "embedded_worker",
    "enqueue_advance",
    "job_id",
    "lease_is_live",
    "prune_waiting_checkpoints",
    "queued_job_ids",
    "request_opening_extraction",
    "requeue_stalled_sessions",
    "resume_failed_sessions",
    "running_embedded_worker",
    "stalled_sessions",
    "warm_up_worker",
]
