"""Test an LLM provider's connection: one tiny chat completion against its
OpenAI-compatible endpoint, with the provider's key, model and timeout. The answer is
success (latency, tokens) or the HTTP status and a short classified error.

Never a response body, an exception text or anything the endpoint chose, and one
answer for every failure before an HTTP answer (see NO_ANSWER): the URL may
point at an internal service (the probe would read it out to whoever presses the button)
and an endpoint may echo the key back. The key only ever goes to the saved URL: the
admin form clears it when the URL changes, and redirects are not followed.

This cannot use diagnosis' provider (scenarios_admin may not import diagnosis); it sends
the same request shape: POST {base_url}/chat/completions with a bearer key."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import httpx
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from scenarios_admin.models import ProviderConfig, ProviderKind

logger = logging.getLogger("scenarios_admin.probe")
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


# Every failure before an HTTP answer (refused, filtered, unreachable, no such name, not
# HTTP, TLS, silence) reads the same on the page and comes after the provider's whole
# timeout: which one it was would tell whoever presses the button what listens on a port
# of a host the server reaches. The cause goes to the server's log.
NO_ANSWER = gettext_lazy(
    "no HTTP answer from the endpoint within its timeout (unreachable, refused or not "
    "HTTP; the server log has the cause)"
)


def target(base_url: str) -> httpx.URL | None:
    """The chat completions URL under `base_url` (its query kept), None when it would not
    go exactly to the base URL's own scheme, host and port, or the URL names a host
    people would misread (credentials before it: "http://api.example.com@10.0.0.5/")."""
    try:
        base = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return None
    if base.scheme not in ("http", "https") or not base.host or base.userinfo:
        return None
    url = base.copy_with(path=base.path.rstrip("/") + "/chat/completions", fragment=None)
    same = (url.scheme, url.host, url.port) == (base.scheme, base.host, base.port)
    return url if same else None


def probe(config: ProviderConfig) -> ProbeResult:
    if config.kind == ProviderKind.OFFLINE:
        return ProbeResult(True, "the offline provider needs no connection")
    url = target(config.base_url)
    if url is None:
        return ProbeResult(
            False,
            str(
                _(
                    "the base URL is not tested: it must be http(s)://host[:port]/path, "
                    "with no user name or password before the host"
                )
            ),
        )
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
    except httpx.HTTPError as exc:
        logger.warning(
            "test connection of provider %s (%s): %s: %s",
            config.name,
            url.copy_with(query=None),
            type(exc).__name__,
            exc,
        )
        # The same wait whatever the cause (a refusal is instant, a filtered port is not).
        time.sleep(max(0.0, started + config.timeout_seconds - time.monotonic()))
        return ProbeResult(False, str(NO_ANSWER))
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
