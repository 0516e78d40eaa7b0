"""Test an LLM provider's connection: one tiny chat completion against its
OpenAI-compatible endpoint, with the provider's key, model and timeout. The answer is
either success (model and latency) or the exact error, so an admin can fix the config.

This cannot use diagnosis' provider (scenarios_admin may not import diagnosis); it sends
the same request shape: POST {base_url}/chat/completions with a bearer key."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass

import httpx

from scenarios_admin.models import ProviderConfig, ProviderKind

PROBE_PROMPT = "Reply with the single word: ok"


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    message: str


def probe(config: ProviderConfig) -> ProbeResult:
    if config.kind == ProviderKind.OFFLINE:
        return ProbeResult(True, "the offline provider needs no connection")
    url = config.base_url.rstrip("/") + "/chat/completions"
    try:
        key = config.api_key()
    except ValueError as exc:
        return ProbeResult(False, f"the stored API key: {exc}")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {
        "model": config.model,
        "messages": [{"role": "user", "content": PROBE_PROMPT}],
        "max_tokens": 5,
        "temperature": 0,
    }
    started = time.monotonic()
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=config.timeout_seconds)
    except httpx.HTTPError as exc:
        return ProbeResult(False, f"{type(exc).__name__} calling {url}: {exc}")
    elapsed = int((time.monotonic() - started) * 1000)
    if response.status_code != 200:
        return ProbeResult(
            False, f"HTTP {response.status_code} from {url}: {_excerpt(response.text)}"
        )
    try:
        data = response.json()
        data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ProbeResult(
            False,
            f"{url} did not answer like an OpenAI-compatible chat completion: "
            f"{_excerpt(response.text)}",
        )
    model = data.get("model") or config.model
    usage = data.get("usage") or {}
    tokens = (
        f", {usage.get('prompt_tokens', 0)} + {usage.get('completion_tokens', 0)} tokens"
        if usage
        else ""
    )
    return ProbeResult(True, f"model {model} answered in {elapsed} ms{tokens}")


def _excerpt(text: str, limit: int = 300) -> str:
    with contextlib.suppress(ValueError):
        text = json.dumps(json.loads(text), ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"
