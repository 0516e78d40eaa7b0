"""LLM providers: the deterministic offline provider and OpenAI-compatible ones, tried in
a fallback chain. Every attempt is recorded (LLMCall + llm.* events) with tokens and cost."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from django.conf import settings

from aero.redact import redact_error
from diagnosis.agent.extraction import Extraction, extract_fields
from scenarios_admin.airport import AirportGraph
from scenarios_admin.definition import value_order
from scenarios_admin.models import ProviderConfig, ProviderKind

logger = logging.getLogger("diagnosis.providers")


class ProviderError(Exception):
    """A provider call failed; the message is already redacted."""


@dataclass
class Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)


@dataclass
class Attempt:
    provider: str
    model: str
    purpose: str
    status: str
    latency_ms: int
    usage: Usage = field(default_factory=Usage)
    error: str = ""


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


class OpenAICompatibleProvider:
    """Any OpenAI-compatible endpoint (OpenAI, DeepSeek, vLLM, Ollama, llama.cpp server)."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.name = config.name
        self.model = config.model
        self.retries = max(1, config.retries)

    def _chat(self, system: str, user: str) -> tuple[str, Usage]:
        from langchain_openai import ChatOpenAI

        client = ChatOpenAI(
            model=self.config.model,
            base_url=self.config.base_url,
            api_key=self.config.api_key() or "not-needed",  # type: ignore[arg-type]
            timeout=self.config.timeout_seconds,
            max_retries=0,  # the chain retries, with backoff and a record of each attempt
            temperature=0,
        )
        try:
            reply = client.invoke([("system", system), ("human", user)])
        except Exception as exc:
            # The error may quote the key (a rejected key often is): only a redacted,
            # bounded text goes on to the LLM call row, the events, the audit log and logs.
            raise ProviderError(
                redact_error(f"{type(exc).__name__}: {exc}", [self.config.api_key()])
            ) from None
        meta = getattr(reply, "usage_metadata", None) or {}
        usage = Usage(int(meta.get("input_tokens", 0)), int(meta.get("output_tokens", 0)))
        usage.cost = (
            Decimal(usage.tokens_in) / 1000 * self.config.price_input_per_1k
            + Decimal(usage.tokens_out) / 1000 * self.config.price_output_per_1k
        )
        return str(reply.content), usage

    def extract(
        self, definition: dict[str, Any], text: str, graph: AirportGraph, asked: str | None
    ) -> tuple[dict[str, Extraction], Usage]:
        schema: dict[str, dict[str, Any]] = {}
        for name in definition["field_order"]:
            spec = definition["fields"][name]
            schema[name] = {"type": spec["type"]}
            if spec.get("values"):
                schema[name]["values"] = value_order(spec)
        system = (
            definition.get("system_prompt", "")
            + "\nExtract the incident fields stated in the operator's message. Reply with one "
            "JSON object mapping field name to value, only for fields the message states. "
            "Enum values must be one of the listed values; bool values are true/false; "
            "positions are node ids or runway designators. Fields: " + json.dumps(schema)
        )
        if asked:
            system += f"\nThe operator is answering the question about {asked!r}."
        content, usage = self._chat(system, text)
        data = _parse_json_object(content)
        found: dict[str, Extraction] = {}
        for name, value in data.items():
            spec = definition["fields"].get(name)
            if spec is None or value is None:
                continue
            if spec["type"] == "enum" and value not in spec.get("values", {}):
                continue
            if spec["type"] == "bool" and not isinstance(value, bool):
                continue
            if spec["type"] == "position":
                node = graph.resolve(str(value))
                if node is None or node.kind not in spec.get("kinds", [node.kind]):
                    continue
                value = str(value).upper()
            found[name] = Extraction(value, f"llm:{self.name}")
        return found, usage


def _parse_json_object(content: str) -> dict[str, Any]:
    start, end = content.find("{"), content.rfind("}")
    if start < 0 or end < start:
        raise ValueError("the model did not reply with a JSON object")
    data = json.loads(content[start : end + 1])
    if not isinstance(data, dict):
        raise ValueError("the model did not reply with a JSON object")
    return data


def configured_providers() -> list[Provider]:
    """Enabled providers by priority, always ending with the offline provider."""
    chain: list[Provider] = []
    for config in ProviderConfig.objects.filter(enabled=True).order_by("priority", "name"):
        if config.kind == ProviderKind.OPENAI:
            chain.append(OpenAICompatibleProvider(config))
    chain.append(OfflineProvider())
    return chain


def call_with_fallback[T](
    providers: list[Provider],
    purpose: str,
    call: Callable[[Provider], tuple[T, Usage]],
    record: Callable[[Attempt], None],
    on_fallback: Callable[[str, str, str], None],
) -> T:
    """Try each provider with its retries (exponential backoff); fall back to the next.
    The offline provider cannot fail, so the chain always answers."""
    last_error = ""
    for index, provider in enumerate(providers):
        for attempt in range(provider.retries):
            started = time.monotonic()
            try:
                value, usage = call(provider)
            except Exception as exc:  # any provider failure degrades to the next one
                last_error = redact_error(f"{type(exc).__name__}: {exc}")
                record(
                    Attempt(
                        provider.name,
                        provider.model,
                        purpose,
                        "error",
                        _ms(started),
                        error=last_error,
                    )
                )
                logger.warning("provider %s failed (%s): %s", provider.name, purpose, last_error)
                if attempt + 1 < provider.retries:
                    time.sleep(settings.AERO_LLM_BACKOFF * (2**attempt))
                continue
            record(Attempt(provider.name, provider.model, purpose, "ok", _ms(started), usage))
            return value
        if index + 1 < len(providers):
            on_fallback(provider.name, providers[index + 1].name, last_error)
    raise RuntimeError(f"every provider failed for {purpose}: {last_error}")


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
