"""Model calls are waits: the node side.

Inside a graph node (`recorded` opens a `WaitScope` when AERO_LLM_WAITS is on) a call to
a real provider does not go out. The chat model's `_generate` (every path to the model
goes through `clients.client_for`, whose client is a `WaitingChatOpenAI`) looks the
call up by its key, `<task>:m<n>` (the node's LangGraph task id, the same for a re-run
of the step, and the call's place in the node):

- answered (an `LLMRequest` row the runner finished): the stored reply is returned, as
  if the model had just answered; nothing is sent and nothing is counted again;
- every real provider failed: a final `ProviderError`, so the chain goes on offline;
- not yet: `ModelWait` is raised. It is a BaseException so that no `except Exception`
  on the way (the SDK wrappers, tenacity, the chain) takes it for a failed call; the
  node wrapper turns it into a LangGraph interrupt carrying the request, and the job
  records the request row and ends (diagnosis.jobs).

The runner (diagnosis.llm_runner) makes the calls and enqueues the session when the
reply is stored; the job resumes the graph and the node re-runs from its first line.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings
from langchain_core.messages import BaseMessage, messages_from_dict, messages_to_dict
from langchain_core.outputs import ChatGeneration, ChatResult

from aero.compiled import Compiled
from diagnosis.agent.usage import ProviderError

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from diagnosis.models import LLMRequest

MAX_WAITS_PER_NODE = 100


class ModelWait(BaseException):
    """The node must wait for the model: `payload` is the interrupt's value."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__(payload["key"])
        self.payload = payload


@dataclass
class WaitScope:
    """One execution of one graph node: numbers its model calls in order."""

    session_id: Any
    task_key: str
    purpose: str = ""
    provider_ids: list[int] = field(default_factory=list)
    count: int = 0
    # Set when the runner reported that every real provider failed: the chain goes on
    # to the offline provider without recording anything the runner already recorded.
    chain_failed: bool = False
    # A key `stored_reply` found no row for: `answer` does not look it up again.
    missing: str | None = None
    # The next call's own key (`call_key`), instead of its place in the node.
    fixed: str | None = None
    # The agent run the node's calls belong to (their stream, their tokens).
    run: int | None = None

    def peek_key(self) -> str:
        return self.fixed if self.fixed is not None else f"{self.task_key}:m{self.count}"

    def next_key(self) -> str:
        key = self.peek_key()
        if self.fixed is not None:
            self.fixed = None  # the numbered keys of the node's other calls do not shift
        else:
            self.count += 1
        return key


_scope: contextvars.ContextVar[WaitScope | None] = contextvars.ContextVar(
    "aero_wait_scope", default=None
)


def waits_enabled() -> bool:
    return bool(settings.AERO_LLM_WAITS)


@contextmanager
def wait_scope(
    session_id: Any, task_key: str, run: int | None = None
) -> Iterator[WaitScope | None]:
    """Model calls made inside become waits (when AERO_LLM_WAITS is on). `run`: the
    agent run they belong to."""
    if not waits_enabled():
        yield None
        return
    scope = WaitScope(session_id, task_key, run=run)
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


def current_scope() -> WaitScope | None:
    return _scope.get()


@contextmanager
def call_key(key: str) -> Iterator[None]:
    """The next model call inside is keyed `key`, not by its place in the node: a call
    whose request is known before any job runs the node (the extraction of a session's
    opening message, recorded with the session) has a key that the session's
    creation and the node both derive from the log. Without a wait scope: no effect."""
    scope = current_scope()
    if scope is None:
        yield
        return
    scope.fixed = key
    try:
        yield
    finally:
        scope.fixed = None


def extraction_key(session_id: Any, seq: int) -> str:
    """The key of the extraction of the operator's message `seq` (one per message)."""
    return f"extract:{session_id}:{seq}"


def request_outside_graph(
    session_id: Any, key: str, call: Callable[[], Any]
) -> dict[str, Any] | None:
    """The request `call` makes through the model as a wait, keyed `key`, without a
    graph node: the interrupt value a node would raise (see `answer`), or None when the
    call needed no model (offline only) or its reply is stored already."""
    token = _scope.set(WaitScope(session_id, task_key=key))
    try:
        with call_key(key):
            call()
    except ModelWait as wait:
        return wait.payload
    finally:
        _scope.reset(token)
    return None


@contextmanager
def no_waits() -> Iterator[None]:
    """Calls made inside go out directly (the runner itself, blocking mode)."""
    token = _scope.set(None)
    try:
        yield
    finally:
        _scope.reset(token)


def serialize_request(messages: Sequence[BaseMessage], kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the runner sends: the messages and the call's options (tools, response
    format), as JSON (the interrupt value and the request row hold it)."""
    options = json.loads(json.dumps(kwargs, default=str))
    return {"messages": messages_to_dict(list(messages)), "kwargs": options}


def deserialize_messages(request: dict[str, Any]) -> list[BaseMessage]:
    return messages_from_dict(request["messages"])


# The answered requests the job read before running the graph (the one it resumes at):
# a node's first look at its reply takes the row from here, not from a second query.
_answered: contextvars.ContextVar[dict[str, LLMRequest] | None] = contextvars.ContextVar(
    "aero_answered_requests", default=None
)


@contextmanager
def answered_requests() -> Iterator[None]:
    """For a job: answered request rows read before the graph runs are kept for it. An
    answered (done or failed) row never changes again, so the copy is the row."""
    token = _answered.set({})
    try:
        yield
    finally:
        _answered.reset(token)


def keep_answered(row: LLMRequest) -> None:
    kept = _answered.get()
    if kept is not None:
        kept[row.key] = row


def answered_row(key: str) -> LLMRequest | None:
    """The answered row `key` the job read before running the graph (taken: read once)."""
    kept = _answered.get()
    return kept.pop(key, None) if kept is not None else None


def _request_by_key() -> QuerySet[LLMRequest]:
    from aero.compiled import Arg
    from diagnosis.models import LLMRequest

    return (
        LLMRequest.objects.filter(key=Arg(0))
        .only("key", "status", "reply", "error", "answered_by")
        .order_by("pk")[:1]
    )


# Read by each model call a job makes or resumes: compiled once per connection.
_request: Compiled[LLMRequest] = Compiled("diagnosis.LLMRequest", _request_by_key)


def _stored(scope: WaitScope, key: str) -> BaseMessage | None:
    """The runner's reply to the call `key`: the message, or None while there is none
    (no row, pending). Every real provider failed: ProviderError (final)."""
    from diagnosis.models import LLMRequestStatus

    if scope.missing == key:
        return None  # stored_reply just looked: no row
    kept = _answered.get()
    row = kept.pop(key, None) if kept is not None else None
    if row is None:
        from diagnosis.events import current_known

        known = current_known(scope.session_id)
        if known is not None and known.request_absent(key):
            scope.missing = key
            return None  # the job's keys say so: no row to read
        row = _request.first(key)
    if row is None:
        scope.missing = key
        return None
    if row.status == LLMRequestStatus.DONE and row.reply is not None:
        # What the model answered when the call was made, even if the conversation grew
        # meanwhile (an operator message during the wait): a paid call never repeats.
        (message,) = messages_from_dict([row.reply])
        return message
    if row.status == LLMRequestStatus.FAILED:
        scope.chain_failed = True
        raise ProviderError(
            row.error or "every model provider failed", retryable=False, error_class="other"
        )
    return None


def stored_reply() -> BaseMessage | None:
    """Inside a wait scope: the stored reply to the node's next model call, taken before
    the caller builds the call's messages. The job that resumes after the call needs only
    the reply; the run that waited built and recorded the request (rebuilding it cost the
    conversation's queries and LangChain's call path at every resume). None
    without a scope or a reply: the caller builds the messages and calls the model, whose
    `answer` then waits, without looking the key up a second time."""
    scope = current_scope()
    if scope is None:
        return None
    key = scope.peek_key()
    try:
        message = _stored(scope, key)
    except BaseException:
        scope.next_key()  # the failed call is this one: the next call is the next key
        raise
    if message is not None:
        scope.next_key()
    return message


def answer(scope: WaitScope, messages: Sequence[BaseMessage], kwargs: dict[str, Any]) -> ChatResult:
    """The stored reply for this call of the node, or ModelWait."""
    key = scope.next_key()
    message = _stored(scope, key)
    if message is not None:
        return ChatResult(generations=[ChatGeneration(message=message)])
    # No digest of the request: the key names the call, and nothing read one (it was a
    # sorted encoding and a hash of the whole request, tools included, per model wait).
    raise ModelWait(
        {
            "kind": "model",
            "key": key,
            "purpose": scope.purpose,
            "providers": scope.provider_ids,
            "request": serialize_request(messages, kwargs),
            "run": scope.run,
        }
    )


def interrupt_for(wait: ModelWait) -> None:
    """Inside the node: interrupt with the request. A resume value left over from the
    previous wait of this node (the node re-ran past it, reading its reply) is consumed
    first; interrupt() raises once no resume value is left."""
    from langgraph.types import interrupt

    for _ in range(MAX_WAITS_PER_NODE):
        interrupt(wait.payload)
    raise RuntimeError(f"more than {MAX_WAITS_PER_NODE} model waits in one node")
