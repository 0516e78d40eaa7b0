"""The LLM runner: model calls as waits, made by an asyncio loop.

A graph node that needs the model records a keyed `LLMRequest` and its job ends
(diagnosis.agent.waits, diagnosis.jobs). This runner:

- claims pending requests with a lease of its own (`claim_token`, renewed by its
  heartbeat every AERO_LLM_CLAIM_SECONDS/4): a killed runner's claims run out and any
  runner takes the request over; every write of a call checks the claim (a runner that
  lost it writes nothing more);
- makes many calls at once on one event loop, with one client per provider config
  (`clients.client_for`; its SDK client with a connection pool of the runner's own,
  kept between calls), the chain's rules kept: tenacity
  retries (3 attempts, 1/2/4 s x AERO_LLM_BACKOFF + jitter, or Retry-After), no retry on
  a final 4xx, the next provider, the offline provider last (the node's own: it needs no
  wait), no attempt started after AERO_LLM_BUDGET_SECONDS;
- streams the reply's text into the log (`llm.delta` events, coalesced: each call's
  text is written at most every AERO_LLM_STREAM_FLUSH seconds, and less often when the
  database is the bottleneck: the text waits in the buffer meanwhile);
- records each attempt once by its key (`llm.call` event + `LLMCall` row + the
  session's token counters in one transaction; the successful attempt in the same
  transaction as the stored reply), then enqueues the session's job with the `enqueue`
  it was handed (the jobs' dispatch_after_commit: this package imports nothing of the
  jobs, which import it).

By concern: `claims` (claims, heartbeat row, pruning), `records` (what a call writes),
`stream` (one streamed call), `runner` (the loop and the three ways to run it).
Production: `manage.py aero_llm_runner` beside the rq workers. Embedded mode:
`start_in_thread()` from the web process. The inline backend (CLI, tests):
`run_pending_inline()` between two runs of the job.
"""

from __future__ import annotations

from diagnosis.llm_runner.claims import BEAT_PREFIX, beat, prune_requests
from diagnosis.llm_runner.records import Dispatch
from diagnosis.llm_runner.runner import Runner, run_pending_inline, start_in_thread

__all__ = [
    "BEAT_PREFIX",
    "Dispatch",
    "Runner",
    "beat",
    "prune_requests",
    "run_pending_inline",
    "start_in_thread",
]
