"""Limits on what people type: every free-text input has a server-side length limit and is
refused, never cut, when it is over it or cannot be stored.

Why these numbers: each text ends up in one event, and the live timeline carries events
over a WebSocket whose frames daphne caps at 1 MB; a catch-up batch holds many events.
A few KB per text keeps any event far below that, and is more than a person writes.
"""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

MAX_MESSAGE = 4000  # an incident description or an answer to the agent
MAX_REASON = 2000  # a decision's reason, a cancellation reason
MAX_NOTE = 2000  # a to-do's resolution note
MAX_LIFT_NOTE = 300  # Restriction.lift_note (a column of that size)
# Largest payload any one event may carry (JSON, UTF-8). Far below daphne's 1 MB frame;
# the texts above (at most 4000 characters, 4 bytes each) always fit.
MAX_EVENT_BYTES = 64 * 1024


class TextRefused(ValueError):
    """The text cannot be accepted as it is; the message says why, for the user."""


def check_text(text: str | None, *, limit: int, what: str, required: str = "") -> str:
    """The stripped text, or TextRefused: empty (when `required` gives the message), over
    `limit` characters, or holding a character PostgreSQL cannot store (NUL)."""
    text = (text or "").strip()
    if not text and required:
        raise TextRefused(required)
    if len(text) > limit:
        raise TextRefused(
            f"The {what} is too long: {len(text)} characters, at most {limit} characters. "
            "Nothing was saved: shorten it and send it again."
        )
    if "\x00" in text:
        raise TextRefused(
            f"The {what} contains a NUL character (U+0000), which cannot be stored; "
            "nothing was saved: remove it and send it again."
        )
    return text


class LimitedTextField(forms.CharField):
    """A CharField whose limit is checked on the server only, with a message that gives
    both lengths. No `maxlength` attribute: a browser silently cuts a longer paste to
    the limit, and the person never learns that part of what they pasted was lost."""

    def __init__(self, *, what: str, max_length: int, **kwargs: object) -> None:
        self.what = what
        self.limit = max_length
        super().__init__(**kwargs)  # type: ignore[arg-type]

    def widget_attrs(self, widget: forms.Widget) -> dict[str, str]:
        attrs = super().widget_attrs(widget)
        attrs.pop("maxlength", None)
        return attrs

    def clean(self, value: object) -> str:
        text = super().clean(value)
        try:
            return check_text(text, limit=self.limit, what=self.what)
        except TextRefused as exc:
            raise ValidationError(str(exc), code="refused") from None
