"""Test an LLM provider's connection: one tiny chat completion against its
OpenAI-compatible endpoint, with the provider's key, model and timeout. The answer is
success (latency, tokens) or the HTTP status and a short classified error.

Never a response body, an exception text or anything the endpoint chose: the URL may
point at an internal service (the probe would read it out to whoever presses the button)
and an endpoint may echo the key back. The key only ever goes to the saved URL: the
admin form clears it when the URL changes, and redirects are not followed.

This cannot use diagnosis' provider (scenarios_admin may not import diagnosis); it sends
the same request shape: POST {base_url}/chat/completions with a bearer key."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from scenarios_admin.models import ProviderConfig, ProviderKind

PROBE_PROMPT = "Reply with the single word: ok"


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    message: str


# What each failing status most likely means, for the person fixing the config.
STATUS_HINTS = {
    400: "the endpoint refused the request (check the model name)",
    401: "the API key was refused",
    403: "the API key may not use this model or endpoint",
    404: "no chat completions endpoint at this URL, or no such model",
    408: "the endpoint timed out",
    429: "rate limited or out of quota",
}


def probe(config: ProviderConfig) -> ProbeResult:
    if config.kind == ProviderKind.OFFLINE:
        return ProbeResult(True, "the offline provider needs no connection")
    url = config.base_url.rstrip("/") + "/chat/completions"
    try:
        key = config.api_key()
    except ValueError as exc:
        return ProbeResult(False, f"the stored API key: {exc}")
    if key and not (key.isascii() and key.isprintable()):
        # Stored before the form refused such keys: no HTTP header can carry it.
        return ProbeResult(False, "the stored API key has characters no HTTP header can carry")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {
        "model": config.model,
        "messages": [{"role": "user", "content": PROBE_PROMPT}],
        "max_tokens": 5,
        "temperature": 0,
    }
    started = time.monotonic()
    try:
        response = httpx.post(
            url, json=body, headers=headers, timeout=config.timeout_seconds, follow_redirects=False
        )
    except httpx.TimeoutException as exc:
        return ProbeResult(
            False, f"{type(exc).__name__}: no answer within {config.timeout_seconds:g} s"
        )
    except httpx.ConnectError:
        return ProbeResult(False, "ConnectError: cannot connect (nothing listening, DNS or TLS)")
    except httpx.HTTPError as exc:
        return ProbeResult(False, f"{type(exc).__name__}: the request failed")
    elapsed = int((time.monotonic() - started) * 1000)
    if response.is_redirect:
        return ProbeResult(False, f"HTTP {response.status_code}: a redirect (not followed)")
    if response.status_code != 200:
        hint = STATUS_HINTS.get(response.status_code) or (
            "the provider failed" if response.status_code >= 500 else "unexpected status"
        )
        return ProbeResult(False, f"HTTP {response.status_code}: {hint}")
    try:
        data = response.json()
        data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return ProbeResult(
            False, "HTTP 200: the answer is not an OpenAI-compatible chat completion"
        )
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    tokens = ""
    if usage:
        try:
            tokens = (
                f", {int(usage.get('prompt_tokens', 0))} + "
                f"{int(usage.get('completion_tokens', 0))} tokens"
            )
        except (TypeError, ValueError):
            tokens = ""
    # The configured model, not the one the answer names: that text is the endpoint's.
    return ProbeResult(True, f"model {config.model} answered in {elapsed} ms{tokens}")
