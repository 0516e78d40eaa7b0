"""What a model call cost, and how it failed: shared by the providers, the model waits
and the runner, below all of them."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from aero.redact import redact_error

# What a failed call's error keeps of the provider's text: a reason, not its error page.
PROVIDER_ERROR_CHARS = 200


@dataclass
class Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)
    # The reply's text, for its `llm.call` event: what replay shows for the call (calls
    # made inside the job; the runner records the streamed text itself).
    text: str = ""
    # The provider reported no usage: the tokens are AERO's estimate (estimate_tokens).
    estimated: bool = False


# --- estimates ----------------------------------------------------------------------------
# A provider that sends no usage (a stream without its usage chunk, a server that never
# reports it) still cost tokens: counting 0 would let budgets run forever. The tokenizer
# the OpenAI API documents (tiktoken) fetches its encodings from the network on first use,
# which an offline installation cannot do, so the estimate is AERO's own stated rule:
# one token per CJK character (cl100k/o200k tokenizers spend about one or more on a
# Chinese character) plus one per 4 other characters (OpenAI's rule of thumb for English),
# rounded up, and 4 tokens per chat message for the format (OpenAI's cookbook figure).

TOKENS_PER_MESSAGE = 4
CHARS_PER_TOKEN = 4


def _is_cjk(char: str) -> bool:
    code = ord(char)
    return (
        0x2E80 <= code <= 0x9FFF  # CJK radicals, kana, ideographs, hangul compat
        or 0xAC00 <= code <= 0xD7AF  # hangul syllables
        or 0xF900 <= code <= 0xFAFF  # CJK compatibility ideographs
        or 0xFF00 <= code <= 0xFFEF  # full-width forms (Chinese punctuation)
        or 0x20000 <= code <= 0x3FFFF  # CJK extensions
    )


def estimate_tokens(text: str) -> int:
    """Tokens of `text` by the stated rule above (0 only for no text)."""
    if not text:
        return 0
    cjk = sum(1 for char in text if _is_cjk(char))
    return cjk + math.ceil((len(text) - cjk) / CHARS_PER_TOKEN)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False, sort_keys=True)


def estimate_request(messages: Iterable[Any], extra: Iterable[Any] = ()) -> int:
    """Input tokens of a chat request: each message's text and tool calls (LangChain
    messages, or (role, text) pairs) plus `extra` (tool schemas, the response format)."""
    total = 0
    for message in messages:
        total += TOKENS_PER_MESSAGE
        if isinstance(message, tuple):
            total += estimate_tokens(_text_of(message[-1]))
            continue
        total += estimate_tokens(_text_of(getattr(message, "content", "") or ""))
        for call in getattr(message, "tool_calls", None) or ():
            total += estimate_tokens(_text_of(call.get("args") or {}))
    return total + sum(estimate_tokens(_text_of(item)) for item in extra if item)


def estimate_reply(content: Any, tool_calls: Iterable[dict[str, Any]] = ()) -> int:
    """Output tokens of a reply: its text and its tool calls' names and arguments."""
    total = estimate_tokens(_text_of(content or ""))
    for call in tool_calls:
        total += estimate_tokens(str(call.get("name") or ""))
        total += estimate_tokens(_text_of(call.get("args") or {}))
    return max(total, 1)  # a reply came back: it cost at least a token


def reported(meta: dict[str, Any] | None) -> tuple[int, int] | None:
    """The provider's own (input, output) tokens from LangChain's usage metadata, or None
    when it reported none (no usage, or zeros: no real call reads no token)."""
    tokens_in = int((meta or {}).get("input_tokens") or 0)
    tokens_out = int((meta or {}).get("output_tokens") or 0)
    if not (tokens_in or tokens_out):
        return None
    return tokens_in, tokens_out


# --- errors -------------------------------------------------------------------------------

# Why a call failed, as the breaker and the metrics count it: nothing listening, no answer
# in time, another network failure (DNS, TLS, a reset), the server's HTTP error, a reply
# that is no usable chat completion.
ErrorClass = Literal["refused", "timeout", "connection", "4xx", "5xx", "bad_reply", "other"]


class ProviderError(Exception):
    """A failed call, with what the retry policy needs to know. `usage` is what the failed
    attempt still cost (a reply that came back but could not be used is paid for). The
    message is redacted (`secrets` and anything key-shaped). `error_class`: see
    ErrorClass; `status`: the HTTP status, if the server answered with one."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        usage: Usage | None = None,
        secrets: Iterable[str] = (),
        error_class: ErrorClass = "bad_reply",
        status: int | None = None,
    ) -> None:
        # The text may quote the key (a rejected key often is, encoded or not): only the
        # error's class ("HTTP 401", "timed out", ...) and a short redacted text go on to
        # the LLM call row, the events every viewer reads, the audit log and logs.
        super().__init__(redact_error(message, secrets, limit=PROVIDER_ERROR_CHARS))
        self.retryable = retryable
        self.retry_after = retry_after
        self.usage = usage or Usage()
        self.error_class: ErrorClass = error_class
        self.status = status
        # Set by the chain once the breaker has seen this failure: the provider's
        # breaker is open now (tenacity's stop condition reads it: no retry against it).
        self.breaker_open = False
