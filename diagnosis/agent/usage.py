"""What a model call cost, and how it failed: shared by the providers, the model waits
and the runner, below all of them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from aero.redact import redact_error


@dataclass
class Usage:
    tokens_in: int = 0
    tokens_out: int = 0
    cost: Decimal = Decimal(0)
    # The reply's text, for its `llm.call` event: what replay shows for the call (calls
    # made inside the job; the runner records the streamed text itself).
    text: str = ""


class ProviderError(Exception):
    """A failed call, with what the retry policy needs to know. `usage` is what the failed
    attempt still cost (a reply that came back but could not be used is paid for). The
    message is redacted (`secrets` and anything key-shaped)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        usage: Usage | None = None,
        secrets: Iterable[str] = (),
    ) -> None:
        # The text may quote the key (a rejected key often is): only a redacted, bounded
        # text goes on to the LLM call row, the events, the audit log and logs.
        super().__init__(redact_error(message, secrets))
        self.retryable = retryable
        self.retry_after = retry_after
        self.usage = usage or Usage()
