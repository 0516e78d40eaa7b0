"""The SDK side of the OpenAI-compatible providers: one LangChain client per provider
config (its calls inside a graph node are waits), the runner's async SDK clients, the
warm-up, and the SDK's errors read as ProviderErrors (retryable or final)."""

from __future__ import annotations

import email.utils
import errno
import json
import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError

from aero.compiled import Compiled
from diagnosis.agent import waits
from diagnosis.agent.usage import ProviderError
from scenarios_admin.models import ProviderConfig, ProviderKind

if TYPE_CHECKING:
    # Imported where a call needs them: the SDKs cost a web process about a second of
    # CPU at start, and the processes that call models import them in warm_up.
    import openai
    from langchain_openai import ChatOpenAI

logger = logging.getLogger("diagnosis.providers")

# HTTP statuses worth another try (the OpenAI SDK's own list); any other 4xx is final.
RETRYABLE_STATUSES = {408, 409, 429}

# Read by every job: compiled once per connection.
enabled_configs = Compiled(
    ProviderConfig, lambda: ProviderConfig.objects.filter(enabled=True).order_by("priority", "name")
)

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
        configs = [c for c in enabled_configs.rows() if c.kind == ProviderKind.OPENAI]
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
