"""LLM providers: the deterministic offline provider and OpenAI-compatible ones (any
endpoint speaking OpenAI's API), each with its extraction call, tokens and cost. The
chain that tries them in turn is diagnosis.agent.fallback; their SDK clients are
diagnosis.agent.clients; the reply schema is diagnosis.agent.structured."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from pydantic import BaseModel

from diagnosis.agent import prompts, waits
from diagnosis.agent.clients import classify, client_for, enabled_configs
from diagnosis.agent.reading import Claim, Extraction, detect_language, reading_of
from diagnosis.agent.structured import extraction_model, parse_reply, response_schema
from diagnosis.agent.usage import (
    ProviderError,
    Usage,
    estimate_reply,
    estimate_request,
    reported,
)
from scenarios_admin.models import ProviderConfig, ProviderKind

logger = logging.getLogger("diagnosis.providers")


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
        self, definition: dict[str, Any], text: str, world: Any, asked: str | None
    ) -> tuple[dict[str, Extraction], Usage]: ...


class OfflineProvider:
    """Deterministic and network-free: the pack's reading with the scenario's synonyms."""

    name = "offline"
    model = "aero-offline-1"
    retries = 1

    def extract(
        self, definition: dict[str, Any], text: str, world: Any, asked: str | None
    ) -> tuple[dict[str, Extraction], Usage]:
        return reading_of(definition).offline(definition, text, world, asked), Usage()


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
        self, definition: dict[str, Any], text: str, world: Any, asked: str | None
    ) -> tuple[dict[str, Extraction], Usage]:
        system = prompts.extraction_system(definition, detect_language(text), asked)
        claims, dropped, usage = self.structured(system, text, extraction_model(definition))
        if dropped:
            logger.info("provider %s: values outside the schema dropped: %s", self.name, dropped)
        return reading_of(definition).ground(definition, text, world, claims, asked), usage


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
        configs = list(enabled_configs.rows())
        if stamp is not None:
            with _stamped_lock:
                _stamped = (stamp, configs)
    chain: list[Provider] = []
    for config in configs:
        if config.kind == ProviderKind.OPENAI:
            chain.append(OpenAICompatibleProvider(config))
    chain.append(OfflineProvider())
    return chain
