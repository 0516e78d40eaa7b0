"""Limits on what people type: every free-text input has a server-side length limit and is
refused, never cut, when it is over it or cannot be stored.

Why these numbers: each text ends up in one event, and the live timeline carries events
over a WebSocket whose frames daphne caps at 1 MB; a catch-up batch holds many events.
A few KB per text keeps any event far below that, and is more than a person writes.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _
from django.utils.translation import pgettext_lazy

MAX_MESSAGE = 4000  # an incident description or an answer to the agent
MAX_REASON = 2000  # a decision's reason, a cancellation reason
MAX_NOTE = 2000  # a to-do's resolution note
MAX_LIFT_NOTE = 300  # a restriction's lift_note (a column of that size)
# Largest payload any one event may carry (JSON, UTF-8), checked by append_event.
# A quarter of daphne's 1 MB frame: what people type (above, at most 16 KB each) always
# fits, and so does a report from a 20,000-character template; the consumers still
# measure what they send, since escaping can grow a text several times.
MAX_EVENT_BYTES = 256 * 1024
# Longest text a model may put in one event (a ReAct note); cut beyond, with a marker.
MAX_MODEL_TEXT = 8000


# What a refusal calls the text (callers name it by one of these words).
WHAT_LABELS = {
    "message": pgettext_lazy("a text the user typed", "message"),
    "answer": pgettext_lazy("a text the user typed", "answer"),
    "note": pgettext_lazy("a text the user typed", "note"),
    "reason": pgettext_lazy("a text the user typed", "reason"),
}


def what_label(what: str) -> str:
    return str(WHAT_LABELS.get(what, what))


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
            _(
                "The %(what)s is too long: %(length)s characters, at most %(limit)s "
                "characters. Nothing was saved: shorten it and send it again."
            )
            % {"what": what_label(what), "length": len(text), "limit": limit}
        )
    if "\x00" in text:
        raise TextRefused(
            _(
                "The %(what)s contains a NUL character (U+0000), which cannot be stored; "
                "nothing was saved: remove it and send it again."
            )
            % {"what": what_label(what)}
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


class EventTooLarge(ValueError):
    """An event's payload is over MAX_EVENT_BYTES: it is not written (nor is anything else
    in its transaction), so no catch-up can ever be asked to carry it."""


def payload_size(payload: dict[str, Any]) -> int:
    """The payload's size as the log stores it: JSON, UTF-8."""
    return len(json.dumps(payload, ensure_ascii=False).encode())


def check_event_size(type: str, size: int) -> None:
    if size > MAX_EVENT_BYTES:
        raise EventTooLarge(
            f"A {type} event of {size} bytes is over the {MAX_EVENT_BYTES}-byte limit of one "
            "event; nothing was written."
        )


def cut_generated(text: str, limit: int) -> tuple[str, int | None]:
    """Text a model or the system generated, cut to `limit` characters with a marker that
    says so in the text itself, and the original length (None when it fit). Never for
    what a person typed: that is refused over its limit (check_text)."""
    if len(text) <= limit:
        return text, None
    marker = f"\n\n[… cut by AERO: {len(text) - limit} of {len(text)} characters not kept]"
    return text[:limit] + marker, len(text)


# Bidirectional controls (embeddings, overrides, isolates, the marks) reorder the text
# around them: "invoice\u202egnp.exe" reads as "invoiceexe.png". Wherever AERO shows text
# it shows them as their code point instead, so nothing is lost and nothing reorders.
BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def neutralise_bidi(text: str) -> str:
    """`text` with each bidirectional control written as its code point ("[U+202E]")."""
    if not BIDI_CONTROLS.search(text):
        return text
    return BIDI_CONTROLS.sub(lambda m: f"[U+{ord(m.group()):04X}]", text)


def natural_key(value: str) -> tuple[tuple[int, int | str], ...]:
    # Digit runs compare as numbers, chunk by chunk: "A10" after "A9", "R0624-3" before
    # "R1836-1". A digit chunk sorts before a letter chunk, so stands ("101") come first.
    return tuple(
        (0, int(chunk)) if chunk.isdigit() else (1, chunk)
        for chunk in re.findall(r"\d+|\D+", value)
    )


def natural_sorted(values: list[str]) -> list[str]:
    return sorted(values, key=natural_key)
