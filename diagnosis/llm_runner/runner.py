"""The runner itself: an asyncio loop that claims pending requests and makes many calls
at once (one client per provider config, tenacity's retries, the next provider, the
offline provider last), its database work on a few threads; and the three ways to run
it: `manage.py aero_llm_runner`, a thread of the web process (embedded mode), and
inline between two runs of a job (the CLI, tests)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone
from langchain_core.messages import AIMessage
from tenacity import AsyncRetrying, retry_if_exception

from aero import metrics
from diagnosis.agent import slow_tools, waits
from diagnosis.agent.clients import async_client_of_its_own, classify, client_for, warm_up
from diagnosis.agent.fallback import backoff_wait, chain_stop, skipped_text
from diagnosis.agent.providers import OpenAICompatibleProvider
from diagnosis.agent.usage import ProviderError, Usage
from diagnosis.llm_runner.claims import (
    BEAT_PREFIX,
    Claimed,
    ClaimLost,
    beat,
    claim,
    release,
    renew,
    unregister,
)
from diagnosis.llm_runner.records import (
    Dispatch,
    cached_providers,
    finish_failed,
    finish_ok,
    finish_tool,
    load_providers,
    record_failure,
    record_fallback,
    record_skip,
    reset_text,
    write_deltas,
)
from diagnosis.llm_runner.stream import stream_reply
from scenarios_admin import breaker

if TYPE_CHECKING:
    import openai

logger = logging.getLogger("diagnosis.llm_runner")


async def backoff_sleep(seconds: float) -> None:
    """The wait between attempts (tests replace it to record waits instead of sleeping)."""
    await asyncio.sleep(seconds)


DB_THREADS = 4


def _db[T](fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """Run on the loop's database threads (`database_threads`: a few, a connection each):
    one thread for every write of 200 calls in flight fell behind, and the renewals of
    its claims with it (the runner then lost its own claims). A call's writes stay in
    order (Claimed.lock)."""

    async def run(*args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))

    return run


@contextlib.asynccontextmanager
async def database_threads() -> AsyncIterator[None]:
    """The loop's default executor: DB_THREADS threads, their connections closed at the
    end (each thread closes its own; the barrier makes every thread take one)."""
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="aero-llm-db")
    loop.set_default_executor(executor)
    try:
        yield
    finally:
        barrier = threading.Barrier(DB_THREADS)

        def close() -> None:
            connections.close_all()
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)

        await asyncio.gather(*(loop.run_in_executor(None, close) for _ in range(DB_THREADS)))


class Runner:
    """`enqueue`: what enqueues a session's job once its reply commits; None: nothing is
    enqueued (inline: the caller runs the job again itself)."""

    def __init__(self, *, enqueue: Dispatch | None = None, name: str | None = None) -> None:
        self.enqueue = enqueue
        self.name = name or f"{BEAT_PREFIX}{socket.gethostname()}:{os.getpid()}"
        self.inflight: dict[str, tuple[Claimed, asyncio.Task[None]]] = {}
        self.started_at = timezone.now()
        # Per LangChain client (one per provider config, `client_for`): its SDK client
        # with a connection pool of this runner's loop, closed at the loop's
        # end. A client replaced by a config edit keeps its entry (the calls in flight
        # still use its pool; its idle connections expire after a few seconds).
        self.sdk_clients: dict[int, tuple[Any, openai.AsyncOpenAI]] = {}
        # Slow tools run on daemon threads of their own (most are blocking clients:
        # httpx, an MCP server's process), at most AERO_SLOW_TOOL_THREADS at once.
        self.tool_slots: asyncio.Semaphore | None = None

    def _sdk_client(self, client: Any) -> openai.AsyncOpenAI:
        entry = self.sdk_clients.get(id(client))
        if entry is None or entry[0] is not client:
            entry = self.sdk_clients[id(client)] = (client, async_client_of_its_own(client))
        return entry[1]

    async def _close_clients(self) -> None:
        clients = [sdk for _, sdk in self.sdk_clients.values()]
        self.sdk_clients.clear()
        await asyncio.gather(*(sdk.close() for sdk in clients), return_exceptions=True)

    # -- loops

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and call until `stop` is set; then let the unfinished calls go."""
        # Before the first beat says the runner is up: the model client's import, and
        # each enabled provider's clients and this loop's pool, which the first call
        # paid for otherwise, with every session's first call behind it.
        for client in await _db(functools.partial(warm_up, under_lease=False))():
            self._sdk_client(client)
        background = [
            asyncio.create_task(self._beat_forever(stop)),
            asyncio.create_task(self._flush_forever(stop)),
        ]
        try:
            while not stop.is_set():
                free = settings.AERO_LLM_RUNNER_CONCURRENCY - len(self.inflight)
                if free > 0:
                    try:
                        held = frozenset(self.inflight)
                        for call in await _db(claim)(free, None, held):
                            self._start(call)
                    except DatabaseError:
                        logger.warning("llm runner: claiming failed", exc_info=True)
                        await _db(close_old_connections)()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), settings.AERO_LLM_RUNNER_POLL)
        finally:
            tokens = [call.token for call, _ in self.inflight.values()]
            for _, task in self.inflight.values():
                task.cancel()
            await asyncio.gather(*(t for _, t in self.inflight.values()), return_exceptions=True)
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            try:
                await _db(release)(tokens)
                await _db(unregister)(self.name)
            except DatabaseError:
                logger.warning("llm runner: could not release its claims", exc_info=True)
            await self._close_clients()

    async def serve(self, stop: asyncio.Event) -> None:
        """run() with its own database threads."""
        async with database_threads():
            await self.run(stop)

    async def process_pending_now(self, session_id: Any = None) -> int:
        """process_pending() with its own database threads."""
        async with database_threads():
            return await self.process_pending(session_id)

    async def process_pending(self, session_id: Any = None) -> int:
        """Claim every pending request (of one session) and make the calls; returns how
        many were made. The inline backend's runner."""
        calls = await _db(claim)(10_000, session_id)
        for call in calls:
            self._start(call)
        flusher_stop = asyncio.Event()
        flusher = asyncio.create_task(self._flush_forever(flusher_stop))
        await asyncio.gather(*(t for _, t in list(self.inflight.values())), return_exceptions=True)
        flusher_stop.set()
        await flusher
        await self._close_clients()
        return len(calls)

    def _start(self, call: Claimed) -> None:
        task = asyncio.create_task(self._handle(call))
        self.inflight[call.key] = (call, task)
        task.add_done_callback(lambda _: self.inflight.pop(call.key, None))

    async def _beat_forever(self, stop: asyncio.Event) -> None:
        interval = settings.AERO_LLM_CLAIM_SECONDS / 4
        while not stop.is_set():
            try:
                await _db(renew)([call.token for call, _ in self.inflight.values()])
                await _db(beat)(self.name, self.started_at)
            except DatabaseError:
                logger.warning("llm runner: heartbeat failed", exc_info=True)
                await _db(close_old_connections)()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def _flush_forever(self, stop: asyncio.Event) -> None:
        interval = settings.AERO_LLM_STREAM_FLUSH
        while True:
            started = time.monotonic()
            pending = [call for call, _ in list(self.inflight.values()) if call.buffer]
            await asyncio.gather(*(self._flush(call) for call in pending))
            if stop.is_set():
                return
            # At most every `interval`; a slow flush simply coalesces more text.
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def _flush(self, call: Claimed) -> None:
        async with call.lock:
            if not call.buffer:
                return
            text, call.buffer[:] = "".join(call.buffer), []
            await self._write_deltas(call, text)

    async def _write_deltas(self, call: Claimed, text: str) -> None:
        try:
            await _db(write_deltas)(call, text)
        except ClaimLost:
            self._drop(call)
        except Exception:
            # The database refused (too many clients, a restart): the text goes back to
            # the front of the buffer and is written with the next piece, in order.
            call.buffer.insert(0, text)
            logger.warning("llm runner: streamed text of %s not written", call.key, exc_info=True)

    def _drop(self, call: Claimed) -> None:
        entry = self.inflight.get(call.key)
        if entry is not None and entry[0] is call:
            entry[1].cancel()

    # -- one request

    async def _handle(self, call: Claimed) -> None:
        try:
            if slow_tools.is_tool_request(call.request):
                await self._tool(call)
            else:
                await self._chain(call)
        except ClaimLost:
            logger.warning("llm runner: lost the claim on %s; another runner has it", call.key)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The claim runs out and the request is taken again (by us or another runner).
            logger.exception("llm runner: request %s failed", call.key)

    async def _tool(self, call: Claimed) -> None:
        """A slow tool's call on a thread of its own, under its timeout: the result, or the
        failure in words (a timeout too), stored once under the claim; then the session's
        job is enqueued. A call still running past its timeout is left to end on its
        thread: its late result is not kept."""
        name, args = call.request["slow_tool"], dict(call.request.get("args") or {})
        started = time.monotonic()
        result: dict[str, Any] = {}
        error, seconds = "", 0.0
        try:
            seconds = slow_tools.slow_tool(name).timeout(args)
            if self.tool_slots is None:
                self.tool_slots = asyncio.Semaphore(settings.AERO_SLOW_TOOL_THREADS)
            async with self.tool_slots:
                running = in_daemon_thread(slow_tools.run_in_thread, name, args)
                result = await asyncio.wait_for(running, seconds)
        except TimeoutError:
            error = f"{name} did not answer within {seconds:g} s"
        except slow_tools.SlowToolFailed as exc:
            error = str(exc)
        except Exception as exc:  # the tool's own bug fails its call, never the runner
            error = f"{type(exc).__name__}: {exc}"
        async with call.lock:
            await _db(finish_tool)(call, name, result, error, _ms(started), self.enqueue)

    async def _chain(self, call: Claimed) -> None:
        providers = cached_providers(call.provider_ids, call.provider_versions)
        if providers is None:
            providers = await _db(load_providers)(call.provider_ids, call.provider_versions)
        messages = waits.deserialize_messages(call.request)
        options = dict(call.request.get("kwargs") or {})
        started_chain = time.monotonic()
        budget = settings.AERO_LLM_BUDGET_SECONDS
        # The last provider that failed (the offline hop's `from`); "" when the last one
        # was skipped (its skip event names the offline provider already).
        last_error, last_name = "", ""
        for index, provider in enumerate(providers):
            remaining = budget - (time.monotonic() - started_chain)
            if remaining <= 0:
                last_error = last_error or "no time left for another attempt"
                break
            next_name = providers[index + 1].name if index + 1 < len(providers) else "offline"
            # The first provider's breaker as the claim read it (no query while it is
            # closed); a later one's is read now: the first one's retries took time.
            seen = call.provider_health if index == 0 else None
            health = seen.get(provider.config.pk) if seen is not None else False
            if health is None:
                admission = breaker.Admission(True)  # closed, nothing counted: no query
            else:
                admission = await _db(breaker.admit)(
                    provider.config.pk, provider.config.timeout_seconds, health
                )
            if not admission.allowed:
                last_error, last_name = skipped_text(admission), ""
                await _db(record_skip)(call, provider, admission, next_name, index)
                metrics.llm_fallback(provider.name, "open")
                logger.info("provider %s skipped (%s): breaker open", provider.name, call.purpose)
                continue
            attempt_number = 0

            async def attempt(
                provider: OpenAICompatibleProvider = provider,
                admission: breaker.Admission = admission,
            ) -> tuple[AIMessage, Usage, int, int]:
                nonlocal attempt_number
                attempt_number += 1
                started = time.monotonic()
                try:
                    message, usage = await self._stream(call, provider, messages, options)
                except (ClaimLost, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    error = classify(exc, [provider.config.api_key()])
                    await _db(record_failure)(
                        call, provider, error, _ms(started), attempt_number, admission.probe
                    )
                    logger.warning(
                        "provider %s failed (%s, %s): %s",
                        provider.name,
                        call.purpose,
                        error.error_class,
                        error,
                    )
                    raise error from None
                return message, usage, _ms(started), attempt_number

            retrying = AsyncRetrying(
                stop=chain_stop(provider, admission, remaining),
                wait=backoff_wait,
                retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
                sleep=lambda seconds: backoff_sleep(seconds),
                reraise=True,
            )
            message: AIMessage
            usage: Usage
            latency: int
            number: int
            try:
                message, usage, latency, number = await retrying(attempt)
            except ProviderError as exc:
                last_error, last_name = str(exc), provider.name
                metrics.llm_fallback(provider.name, "failed")
                if index + 1 < len(providers):
                    await _db(record_fallback)(call, provider.name, next_name, last_error, index)
                continue
            change = ""
            if breaker.resets(admission):
                change = await _db(breaker.succeeded)(provider.config.pk, admission)
                metrics.llm_breaker(provider.name, change)
            async with call.lock:
                # The last of the text goes with the reply, in its transaction.
                tail, call.buffer[:] = "".join(call.buffer), []
                await _db(finish_ok)(
                    call, provider, message, usage, latency, number, self.enqueue, tail, change
                )
            return
        await self._flush(call)
        async with call.lock:
            await _db(finish_failed)(call, last_error, last_name, self.enqueue)

    async def _stream(
        self,
        call: Claimed,
        provider: OpenAICompatibleProvider,
        messages: list[Any],
        options: dict[str, Any],
    ) -> tuple[AIMessage, Usage]:
        """One attempt, streamed: the text goes to the call's buffer as it arrives."""
        import openai  # loaded by client_for's warm-up already; not at the web's start

        if call.attempts:
            async with call.lock:
                call.buffer.clear()
                await _db(reset_text)(call)  # a new attempt streams a new text
        try:
            client = client_for(provider.config, under_lease=False)
            message = await stream_reply(
                client, messages, options, call.buffer, self._sdk_client(client)
            )
        except (openai.APIError, asyncio.CancelledError, ClaimLost):
            raise
        except Exception as exc:
            # A body that is no event stream (or breaks it) is an unusable reply: retried.
            raise ProviderError(
                f"invalid response: {type(exc).__name__}: {exc}", retryable=True
            ) from None
        usage = provider.usage(message, messages, options)
        if "response_format" in options:
            # Structured output: a reply that is not a JSON object is an unusable reply,
            # retried like a failed call (and paid for); the node validates the schema.
            try:
                data = json.loads(str(message.content))
            except json.JSONDecodeError as exc:
                raise ProviderError(
                    f"the model's reply is not valid JSON ({exc.msg} at {exc.pos})",
                    retryable=True,
                    usage=usage,
                ) from None
            if not isinstance(data, dict):
                raise ProviderError(
                    "the model's reply is not a JSON object", retryable=True, usage=usage
                )
        return message, usage


def in_daemon_thread[T](fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """`fn(*args)` on a daemon thread of its own: a slow tool past its timeout (a hung
    server, a source that never answers) neither holds a pool's thread nor keeps a
    stopping runner from exiting, as a pool's threads, joined at exit, would."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():  # not after a timeout cancelled the wait
            outcome()

    def target() -> None:
        try:
            outcome = functools.partial(future.set_result, fn(*args))
        except BaseException as exc:
            outcome = functools.partial(future.set_exception, exc)
        # A runner that stopped meanwhile has closed its loop: nobody waits any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=target, daemon=True, name="aero-tool").start()
    return future


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


# --- the three ways to run it -----------------------------------------------------------


def run_pending_inline(session_id: Any) -> bool:
    """Make the session's pending calls now, on an event loop of a fresh thread (the
    caller's thread may already run one: Playwright's tests). False when there were none
    to claim (another runner holds them)."""
    result: list[int] = []

    def target() -> None:
        try:
            result.append(asyncio.run(Runner(enqueue=None).process_pending_now(session_id)))
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="aero-llm-inline")
    thread.start()
    thread.join()
    return bool(result and result[0])


_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def start_in_thread(enqueue: Dispatch) -> None:
    """Embedded mode: the runner as an event loop on a daemon thread of this process."""
    global _thread
    with _thread_lock:
        if _thread is not None and _thread.is_alive():
            return

        def target() -> None:
            try:
                asyncio.run(Runner(enqueue=enqueue).serve(asyncio.Event()))
            except Exception:
                logger.exception("the embedded LLM runner stopped")
            finally:
                connections.close_all()

        _thread = threading.Thread(target=target, daemon=True, name="aero-llm-runner")
        _thread.start()
