"""LLM providers: the deterministic offline provider and OpenAI-compatible ones, tried in
a fallback chain. Every attempt is recorded (LLMCall + llm.* events) with tokens and cost.

Retries are tenacity's: up to `retries` attempts per provider (3 by default), waiting
1/2/4 s (x AERO_LLM_BACKOFF) plus jitter, or what the server's Retry-After asks for. A
request the server refused for good (400, 401, 403, 404, ...) is not retried; the chain
moves to the next provider, the offline provider last (it cannot fail). The whole chain
of real providers starts no attempt after AERO_LLM_BUDGET_SECONDS, and no attempt lasts
longer than three quarters of the job's lease: the job's heartbeat renews the lease
while the chain runs, and a hung call ends before a lease it could not renew runs out.
"""

from __future__ import annotations

import email.utils
import errno
import functools
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, Protocol

from django.conf import settings
from django.db import DatabaseError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
)
from tenacity.stop import stop_base

from aero import metrics
from aero.compiled import Compiled
from diagnosis.agent import prompts, waits
from diagnosis.agent.extraction import Extraction, detect_language, extract_fields
from diagnosis.agent.grounding import Claim, ground
from diagnosis.agent.usage import (
    ProviderError,
    Usage,
    estimate_reply,
    estimate_request,
    reported,
)
from scenarios_admin import breaker
from scenarios_admin.airport import AirportGraph
from scenarios_admin.definition import value_order
from scenarios_admin.models import ProviderConfig, ProviderKind

if TYPE_CHECKING:
    # Imported where a call needs them: the SDKs cost a web process about a second of
    # CPU at start, and the processes that call models import them in warm_up.
    import openai
    from langchain_openai import ChatOpenAI

logger = logging.getLogger("diagnosis.providers")

# HTTP statuses worth another try (the OpenAI SDK's own list); any other 4xx is final.
RETRYABLE_STATUSES = {408, 409, 429}
MAX_RETRY_AFTER = 60.0


@dataclass
class Attempt:
    provider: str
    model: str
    purpose: str
    status: str
    latency_ms: int
    usage: Usage = field(default_factory=Usage)
    error: str = ""
    attempt: int = 1
    retryable: bool = False
    error_class: str = ""
    # What this attempt did to the provider's circuit breaker ("opened", "closed").
    breaker: str = ""


class Provider(Protocol):
    name: str
    model: str
    retries: int

    def extract(
        self, definition: dict[str, Any], text: str, graph: AirportGraph, asked: str | None
    ) -> tuple[dict[str, Extraction], Usage]: ...


class OfflineProvider:
    """Deterministic and network-free: extraction with the scenario's synonyms."""

    name = "offline"
    model = "aero-offline-1"
    retries = 1

    def extract(
        self, definition: dict[str, Any], text: str, graph: AirportGraph, asked: str | None
    ) -> tuple[dict[str, Extraction], Usage]:
        return extract_fields(definition, text, graph, asked), Usage()


# --- structured output ------------------------------------------------------------------


def extraction_model(definition: dict[str, Any]) -> type[BaseModel]:
    """The reply schema for one scenario: per field an optional {value, quote}; enum values
    are the scenario's values. Sent as the json_schema response format and used to validate
    the reply. Built once per process and scenario fields: building the pydantic
    classes and their JSON schema was paid at every extraction, a resumed step included."""
    fields = [[name, definition["fields"][name]] for name in definition["field_order"]]
    return _extraction_model(json.dumps(fields, sort_keys=True, ensure_ascii=False))


def response_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """The json_schema response format of a reply schema (a copy of the cached one)."""
    return json.loads(_response_schema(schema))


@functools.lru_cache(maxsize=64)
def _response_schema(schema: type[BaseModel]) -> str:
    return json.dumps({"name": schema.__name__, "schema": schema.model_json_schema()})


@functools.lru_cache(maxsize=64)
def _extraction_model(fields_json: str) -> type[BaseModel]:
    pairs: list[tuple[str, dict[str, Any]]] = json.loads(fields_json)
    properties: dict[str, Any] = {}
    for name, spec in pairs:
        value_type: Any
        if spec["type"] == "enum":
            value_type = Literal[tuple(value_order(spec))]
        elif spec["type"] == "bool":
            value_type = bool
        elif spec["type"] == "number":
            value_type = float
        else:
            value_type = str
        item = create_model(
            f"Field_{name}",
            __config__=ConfigDict(extra="forbid"),
            value=(value_type, ...),
            quote=(
                str,
                Field(description="the operator's exact words that state this value"),
            ),
        )
        properties[name] = (
            item | None,
            Field(None, description=f"{spec['label']['en']} ({spec['type']})"),
        )
    model: type[BaseModel] = create_model(
        "ExtractedFields",
        __config__=ConfigDict(extra="ignore", protected_namespaces=()),
        **properties,
    )
    return model


def parse_reply(model: type[BaseModel], content: str) -> tuple[dict[str, Claim], list[str]]:
    """Validate the model's JSON with the schema. A field whose value breaks the schema
    (an enum value the scenario does not have) is dropped and named; the others stay."""
    try:
        data = json.loads(content)
    except json.JSONDecodeError as exc:
        raise ProviderError(
            f"the model's reply is not valid JSON ({exc.msg} at {exc.pos})", retryable=True
        ) from exc
    if not isinstance(data, dict):
        raise ProviderError("the model's reply is not a JSON object", retryable=True)
    dropped: list[str] = []
    while True:
        try:
            parsed = model.model_validate(data)
            break
        except ValidationError as exc:
            bad = {str(error["loc"][0]) for error in exc.errors() if error["loc"]}
            if not bad or not bad.issubset(data):
                raise ProviderError(f"the reply breaks the schema: {exc}", retryable=True) from exc
            dropped += sorted(bad)
            data = {k: v for k, v in data.items() if k not in bad}
    claims: dict[str, Claim] = {}
    for name in model.model_fields:
        item = getattr(parsed, name)
        if item is not None:
            claims[name] = Claim(item.value, item.quote)
    return claims, dropped


# --- OpenAI-compatible ------------------------------------------------------------------

_clients: dict[tuple[int, str, str, str, float], ChatOpenAI] = {}
_clients_lock = threading.Lock()


def call_timeout(config: ProviderConfig, *, under_lease: bool = True) -> float:
    """The provider's timeout; a call made inside a job (`under_lease`) stays below the
    job's lease (three quarters of it). The LLM runner holds no job lease: its calls
    wait the provider's whole timeout."""
    if not under_lease:
        return max(1.0, config.timeout_seconds)
    return max(1.0, min(config.timeout_seconds, settings.AERO_LEASE_SECONDS * 3 / 4))


_waiting_class: type[ChatOpenAI] | None = None


def waiting_chat_class() -> type[ChatOpenAI]:
    """ChatOpenAI whose calls made inside a graph node are waits (diagnosis.agent.waits):
    every path to the model (extraction, a ReAct step, a repair turn) goes through it."""
    global _waiting_class
    if _waiting_class is None:
        from langchain_openai import ChatOpenAI

        class WaitingChatOpenAI(ChatOpenAI):
            def _generate(
                self,
                messages: list[Any],
                stop: list[str] | None = None,
                run_manager: Any = None,
                **kwargs: Any,
            ) -> Any:
                scope = waits.current_scope()
                if scope is None:
                    return super()._generate(messages, stop, run_manager, **kwargs)
                return waits.answer(scope, messages, {**kwargs, **({"stop": stop} if stop else {})})

        _waiting_class = WaitingChatOpenAI
    return _waiting_class


def client_for(config: ProviderConfig, *, under_lease: bool = True) -> ChatOpenAI:
    """One client (and its HTTP connection pool) per provider config, reused by every call
    in the process; a change of what the client is built from (model, base URL, key,
    timeout) makes a new one. Keyed by those values, not by updated_at: a write that does
    not touch updated_at (a queryset update, the key rotation) is seen too. The LLM
    runner's asynchronous calls use the same client (its payload, its SDK client), built
    with the runner's timeout (`under_lease=False`: see call_timeout)."""
    ChatOpenAI = waiting_chat_class()  # noqa: N806

    timeout = call_timeout(config, under_lease=under_lease)
    key = (config.pk, config.model, config.base_url, config.api_key_encrypted, timeout)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            # The runner's client and a job's may differ by their timeout: both are kept.
            current = {call_timeout(config), call_timeout(config, under_lease=False)}
            for stale in [k for k in _clients if k[0] == config.pk and k[-1] not in current]:
                del _clients[stale]
            client = ChatOpenAI(
                model=config.model,
                stream_usage=True,  # the runner streams; the usage chunk counts the tokens
                base_url=config.base_url,
                api_key=config.api_key() or "not-needed",  # type: ignore[arg-type]
                timeout=timeout,
                max_retries=0,  # the chain retries, with backoff and a record of each attempt
                temperature=0,
            )
            _clients[key] = client
        return client


def async_client_of_its_own(chat: ChatOpenAI) -> openai.AsyncOpenAI:
    """`chat`'s SDK async client (its key, base URL, timeout, no SDK retries) with an HTTP
    connection pool of its own, for one event loop: the LLM runner keeps connections
    alive between calls, and LangChain's default pool is one per process and
    base URL, shared by every loop: a connection left in it by one loop (a
    `run_pending_inline` run) broke in the next ("Event loop is closed"). Its owner
    closes it (`aclose`) before its loop ends.

    The transport is aiohttp, the SDK's own choice "for improved concurrency" (its
    `aiohttp` extra): with 200 streamed calls in flight, httpx2's pool (on
    anyio) spent about a third of the runner's CPU on cancel scopes and on probing every
    idle connection at each request's start and end. The request's timeouts are the
    SDK's per request (connect, and read between two chunks), as before. Without
    aiohttp installed: LangChain's own httpx pool builder (TCP keepalive, or none when a
    proxy is set in the environment), only not shared."""
    import openai

    try:
        return chat.root_async_client.copy(http_client=openai.DefaultAioHttpClient())
    except RuntimeError:
        pass  # the SDK's aiohttp extra is not installed
    try:
        from langchain_openai.chat_models._client_utils import (
            _build_async_httpx_client,
            _resolve_socket_options,
            _should_bypass_socket_options_for_proxy_env,
        )
    except ImportError:
        # LangChain's private builder moved (an upgrade): the SDK's public default pool,
        # still one of its own, without LangChain's TCP keepalive options (the client's
        # own timeout still applies per request).
        return chat.root_async_client.copy(http_client=openai.DefaultAsyncHttpxClient())

    bypass = _should_bypass_socket_options_for_proxy_env(
        http_socket_options=chat.http_socket_options,
        http_client=chat.http_client,
        http_async_client=chat.http_async_client,
        openai_proxy=chat.openai_proxy,
    )
    options = () if bypass else _resolve_socket_options(chat.http_socket_options)
    http = _build_async_httpx_client(chat.openai_api_base, chat.request_timeout, options)
    return chat.root_async_client.copy(http_client=http)


def _retry_after(response: Any) -> float | None:
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    if headers.get("retry-after-ms"):
        try:
            return float(headers["retry-after-ms"]) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def _refused(exc: BaseException) -> bool:
    """Whether nothing listened at the address: a ConnectionRefusedError anywhere in the
    chain of causes. The SDK's aiohttp transport wraps a refused connect in its
    ConnectTimeout, which the SDK reports as a timeout ("timed out" for a closed port)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError):
            return True
        if isinstance(current, OSError) and current.errno == errno.ECONNREFUSED:
            return True
        current = current.__cause__ or current.__context__
    return False


def classify(exc: Exception, secrets: Iterable[str] = ()) -> ProviderError:
    """An SDK error as a ProviderError: retryable or final, with the server's Retry-After
    and its class (refused, timeout, connection, 4xx, 5xx, bad_reply); its text redacted
    (`secrets`: the provider's key)."""
    if isinstance(exc, ProviderError):
        return exc
    import openai

    secrets = list(secrets)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = status in RETRYABLE_STATUSES or status >= 500
        body = exc.body if isinstance(exc.body, dict) else {}
        detail = body.get("message") or (body.get("error") or {}).get("message") or exc.message
        return ProviderError(
            f"HTTP {status}: {detail}",
            retryable=retryable,
            retry_after=_retry_after(exc.response) if retryable else None,
            secrets=secrets,
            error_class="5xx" if status >= 500 else "4xx",
            status=status,
        )
    if _refused(exc):
        return ProviderError(
            "connection refused (nothing listens at the provider's address)",
            retryable=True,
            secrets=secrets,
            error_class="refused",
        )
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError("timed out", retryable=True, secrets=secrets, error_class="timeout")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return ProviderError(
            f"connection failed: {cause}", retryable=True, secrets=secrets, error_class="connection"
        )
    if isinstance(exc, openai.APIResponseValidationError | json.JSONDecodeError):
        return ProviderError(f"invalid response: {exc}", retryable=True, secrets=secrets)
    return ProviderError(
        f"{type(exc).__name__}: {exc}", retryable=False, secrets=secrets, error_class="other"
    )


class OpenAICompatibleProvider:
    """Any OpenAI-compatible endpoint (OpenAI, DeepSeek, vLLM, Ollama, llama.cpp server)."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.name = config.name
        self.model = config.model
        self.retries = max(1, config.retries)

    def cost(self, tokens_in: int, tokens_out: int) -> Decimal:
        return (
            Decimal(tokens_in) / 1000 * self.config.price_input_per_1k
            + Decimal(tokens_out) / 1000 * self.config.price_output_per_1k
        )

    def usage(
        self, reply: Any, messages: Iterable[Any] = (), options: dict[str, Any] | None = None
    ) -> Usage:
        """A reply's tokens and cost: the provider's own count, or, when it reported none
        (a stream without its usage chunk), AERO's estimate of the request (`messages`,
        the tools and response format in `options`) and the reply, marked `estimated`."""
        counted = reported(getattr(reply, "usage_metadata", None))
        estimated = counted is None
        if counted is None:
            extra = [(options or {}).get(key) for key in ("tools", "response_format")]
            counted = (
                estimate_request(messages, extra),
                estimate_reply(reply.content, getattr(reply, "tool_calls", None) or ()),
            )
        tokens_in, tokens_out = counted
        return Usage(tokens_in, tokens_out, self.cost(tokens_in, tokens_out), estimated=estimated)

    def structured(
        self, system: str, user: str, schema: type[BaseModel]
    ) -> tuple[dict[str, Claim], list[str], Usage]:
        # The schema goes out as the json_schema response format; the reply is validated
        # here (parse_reply) rather than by LangChain's parser, so that one bad value
        # drops one field, not the whole reply, and a failed parse still counts its tokens.
        try:
            # A resume reads the stored reply without LangChain's call path, and
            # without the response format, which only the request needs.
            messages = [("system", system), ("human", user)]
            response_format = {"type": "json_schema", "json_schema": response_schema(schema)}
            raw = waits.stored_reply()
            if raw is None:
                raw = client_for(self.config).invoke(messages, response_format=response_format)
        except Exception as exc:
            # from None: the SDK's exception may quote the key; only the redacted text
            # travels on (tracebacks in logs included).
            raise classify(exc, [self.config.api_key()]) from None
        usage = self.usage(raw, messages, {"response_format": response_format})
        usage.text = str(raw.content)
        try:
            claims, dropped = parse_reply(schema, str(raw.content))
        except ProviderError as exc:
            exc.usage = usage  # the reply was paid for even if unusable
            raise
        return claims, dropped, usage

    def extract(
        self, definition: dict[str, Any], text: str, graph: AirportGraph, asked: str | None
    ) -> tuple[dict[str, Extraction], Usage]:
        system = prompts.extraction_system(definition, detect_language(text), asked)
        claims, dropped, usage = self.structured(system, text, extraction_model(definition))
        if dropped:
            logger.info("provider %s: values outside the schema dropped: %s", self.name, dropped)
        return ground(definition, text, graph, claims, asked), usage


# Read by every job: compiled once per connection.
_enabled = Compiled(
    ProviderConfig, lambda: ProviderConfig.objects.filter(enabled=True).order_by("priority", "name")
)


# The enabled configs as last read, under the stamp of every config row read with a job's
# lease: (stamp, configs).
_stamped: tuple[str, list[ProviderConfig]] | None = None
_stamped_lock = threading.Lock()


def configured_providers(stamp: str | None = None) -> list[Provider]:
    """Enabled providers by priority, always ending with the offline provider. `stamp`:
    a digest of every provider config row, read with the job's lease; the
    same stamp as the last read's takes that read's rows, with no query. Any change to a
    config (an edit, a new key, one enabled, disabled or deleted) changes the stamp."""
    global _stamped
    configs: list[ProviderConfig] | None = None
    if stamp is not None:
        with _stamped_lock:
            if _stamped is not None and _stamped[0] == stamp:
                configs = _stamped[1]
    if configs is None:
        configs = list(_enabled.rows())
        if stamp is not None:
            with _stamped_lock:
                _stamped = (stamp, configs)
    chain: list[Provider] = []
    for config in configs:
        if config.kind == ProviderKind.OPENAI:
            chain.append(OpenAICompatibleProvider(config))
    chain.append(OfflineProvider())
    return chain


def warm_up_imports() -> None:
    """The modules a process's first model call would import (most of the warm-up's
    time), with no database read: LangChain's OpenAI client, through its class."""
    waiting_chat_class()


def warm_up(*, under_lease: bool = True) -> list[ChatOpenAI]:
    """What the first model call of a process would otherwise pay, paid at its start
    (a worker's, the runner's, before they say they are up): LangChain's OpenAI client
    imported, and a client built for each enabled provider config, with its HTTP
    pools and TLS contexts, which otherwise cost the first ReAct step of a worker and
    the runner's first call about a second, with every new session behind them.
    Returns the clients built; a database not ready yet (a worker
    started before the migrations) builds none: the first call builds its own."""
    warm_up_imports()
    try:
        configs = [c for c in _enabled.rows() if c.kind == ProviderKind.OPENAI]
    except DatabaseError:
        logger.warning("warm-up: the provider configs could not be read", exc_info=True)
        return []
    clients = []
    for config in configs:
        try:
            clients.append(client_for(config, under_lease=under_lease))
        except Exception:  # a config its first call will fail on, recorded there
            logger.warning("warm-up: no client for provider %s", config.name, exc_info=True)
    return clients


# --- the chain --------------------------------------------------------------------------


def backoff_sleep(seconds: float) -> None:
    """The wait between attempts (tests replace it to record waits instead of sleeping)."""
    time.sleep(seconds)


def backoff_wait(retry_state: RetryCallState) -> float:
    """Retry-After when the server sent one, else 1/2/4 s (x AERO_LLM_BACKOFF) + jitter."""
    outcome = retry_state.outcome
    error = outcome.exception() if outcome else None
    if isinstance(error, ProviderError) and error.retry_after is not None:
        return min(error.retry_after, MAX_RETRY_AFTER)
    base = settings.AERO_LLM_BACKOFF
    exponential = base * 2 ** (retry_state.attempt_number - 1)
    return float(min(exponential, 4 * base) + random.uniform(0, base / 4))


class _StopWhenOpen(stop_base):
    """tenacity's stop condition for a provider whose breaker the last failure found
    open (opened by it, or by other calls meanwhile): no retry against it."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        error = outcome.exception() if outcome is not None else None
        return isinstance(error, ProviderError) and error.breaker_open


def chain_stop(provider: Provider, admission: breaker.Admission, remaining: float) -> stop_base:
    """When the chain stops trying one provider: after its retries (one attempt for the
    half-open probe), when no time is left, or as soon as its breaker is open."""
    attempts = 1 if admission.probe else provider.retries
    return stop_after_attempt(attempts) | stop_before_delay(max(remaining, 0)) | _StopWhenOpen()


def skipped_text(admission: breaker.Admission) -> str:
    if admission.state == breaker.OPEN and admission.retry_at is not None:
        return f"circuit breaker open until {admission.retry_at.isoformat(timespec='seconds')}"
    return "circuit breaker half-open: another call is its probe"


def skipped_payload(
    provider: str, next_provider: str, admission: breaker.Admission, purpose: str, request: str
) -> dict[str, Any]:
    """The `llm.skipped` event of a provider the chain did not try."""
    payload: dict[str, Any] = {
        "provider": provider,
        "to": next_provider,
        "state": admission.state,
        "until": admission.retry_at.isoformat() if admission.retry_at else "",
        "purpose": purpose,
    }
    if request:
        payload["request"] = request
    return payload


def call_with_fallback[T](
    providers: list[Provider],
    purpose: str,
    call: Callable[[Provider], tuple[T, Usage]],
    record: Callable[[Attempt], None],
    on_fallback: Callable[[str, str, str], None],
    on_skip: Callable[[dict[str, Any]], None] | None = None,
) -> T:
    """Try each provider with its retries; fall back to the next. A provider whose
    circuit breaker is open is skipped at once (`on_skip` gets the `llm.skipped`
    payload). The offline provider cannot fail, so the chain always answers. Inside a
    graph node with waits on, the real providers' part of the chain is the LLM runner's
    (call_waiting)."""
    scope = waits.current_scope()
    if scope is not None and any(not isinstance(p, OfflineProvider) for p in providers):
        return call_waiting(scope, providers, purpose, call, record, on_fallback)
    last_error = ""
    budget = settings.AERO_LLM_BUDGET_SECONDS
    started_chain = time.monotonic()
    for index, provider in enumerate(providers):
        offline = isinstance(provider, OfflineProvider)
        remaining = budget - (time.monotonic() - started_chain)
        next_name = providers[index + 1].name if index + 1 < len(providers) else ""
        config: ProviderConfig | None = getattr(provider, "config", None)
        # A config never saved (a test's, a preview) has no breaker row to share.
        shared = config is not None and not config._state.adding
        admission = breaker.Admission(True)
        if shared and config is not None and remaining > 0:  # no probe taken for nothing
            admission = breaker.admit(config.pk, config.timeout_seconds)
        if not offline and remaining <= 0:
            last_error = last_error or "no time left within the lease"
        elif not admission.allowed:
            last_error = skipped_text(admission)
            if on_skip is not None:
                on_skip(skipped_payload(provider.name, next_name, admission, purpose, ""))
            metrics.llm_fallback(provider.name, "open")
            continue  # the skip event names the next provider: no fallback event too
        else:
            attempt_number = 0

            def attempt(
                provider: Provider = provider,
                config: ProviderConfig | None = config,
                admission: breaker.Admission = admission,
                shared: bool = shared,
            ) -> T:
                nonlocal attempt_number
                attempt_number += 1
                started = time.monotonic()
                try:
                    value, usage = call(provider)
                except Exception as exc:  # any provider failure degrades to the next one
                    error = classify(exc, [config.api_key()] if config is not None else [])
                    change = ""
                    if shared and config is not None:
                        change = breaker.failed(
                            config.pk, error.error_class, error.status, str(error), admission.probe
                        )
                        error.breaker_open = change in (breaker.OPENED, breaker.OPEN)
                        metrics.llm_attempt_failed(provider.name, error.error_class)
                        metrics.llm_breaker(provider.name, change)
                    record(
                        Attempt(
                            provider.name,
                            provider.model,
                            purpose,
                            "error",
                            _ms(started),
                            error.usage,
                            error=str(error),
                            attempt=attempt_number,
                            retryable=error.retryable,
                            error_class=error.error_class,
                            breaker=change if change == breaker.OPENED else "",
                        )
                    )
                    logger.warning(
                        "provider %s failed (%s, %s): %s",
                        provider.name,
                        purpose,
                        error.error_class,
                        error,
                    )
                    raise error from None
                change = ""
                if shared and config is not None:
                    change = breaker.succeeded(config.pk, admission)
                    metrics.llm_breaker(provider.name, change)
                record(
                    Attempt(
                        provider.name,
                        provider.model,
                        purpose,
                        "ok",
                        _ms(started),
                        usage,
                        attempt=attempt_number,
                        breaker=change,
                    )
                )
                return value

            retrying = Retrying(
                stop=chain_stop(provider, admission, remaining),
                wait=backoff_wait,
                retry=retry_if_exception(lambda e: isinstance(e, ProviderError) and e.retryable),
                sleep=lambda seconds: backoff_sleep(seconds),
                reraise=True,
            )
            try:
                return retrying(attempt)
            except ProviderError as exc:
                last_error = str(exc)
                if not offline:
                    metrics.llm_fallback(provider.name, "failed")
        if next_name:
            on_fallback(provider.name, next_name, last_error)
    raise RuntimeError(f"every provider failed for {purpose}: {last_error}")


def call_waiting[T](
    scope: waits.WaitScope,
    providers: list[Provider],
    purpose: str,
    call: Callable[[Provider], tuple[T, Usage]],
    record: Callable[[Attempt], None],
    on_fallback: Callable[[str, str, str], None],
) -> T:
    """The chain as a wait. The call runs against the first real provider; its
    model calls read the runner's stored replies or raise ModelWait (the node interrupts).
    The runner tried every real provider with the retries above and recorded each
    attempt, its tokens and each fallback: nothing of that is recorded again here. What is
    left to the node: a stored reply it cannot use (recorded, then offline) and the
    offline provider itself, which needs no wait (deterministic and instant)."""
    real = [p for p in providers if not isinstance(p, OfflineProvider)]
    offline = [p for p in providers if isinstance(p, OfflineProvider)]
    scope.purpose = purpose
    scope.provider_ids = [int(p.config.pk) for p in real if hasattr(p, "config")]
    scope.chain_failed = False
    first = real[0]
    started = time.monotonic()
    try:
        value, _usage = call(first)
        return value  # its tokens were counted by the runner, once
    except Exception as exc:
        config = getattr(first, "config", None)
        error = classify(exc, [config.api_key()] if config is not None else [])
        if not scope.chain_failed:
            # The reply came back but this node could not use it (the runner checks only
            # what every caller needs): a failed attempt of its own, no tokens (counted).
            record(
                Attempt(
                    first.name,
                    first.model,
                    purpose,
                    "error",
                    _ms(started),
                    error=str(error),
                    attempt=1,
                    retryable=False,
                )
            )
            if offline:
                on_fallback(first.name, offline[0].name, str(error))
        if not offline:
            raise RuntimeError(f"every provider failed for {purpose}: {error}") from None
    started = time.monotonic()
    value, usage = call(offline[0])
    record(Attempt(offline[0].name, offline[0].model, purpose, "ok", _ms(started), usage))
    return value


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
