"""Grounding: a field value from a model counts only with evidence in the operator's text.

A model's value for a field is accepted (confirmed) when
- the scenario's synonyms tie a span of the text to that same value (the offline
  extractor reads the same value, not as an ambiguous reading), or
- for a value the words themselves state (a flight, a position, a number, free text):
  the model's quote occurs in the text, states that value, and is not a span that
  already evidences another field (a span that evidences one field must not silently
  evidence another), nor a synonym of this field that the text denies or doubts.
A quote for a choice (an enum or a yes/no) proves only that the words exist, not what
they mean: "发动机仍在运转" quoted as "仍在" (the engine's words) or "泄漏" (any leak)
"stated" a continuing leak. Such a value counts only when the synonyms tie it; with a
quote of its own it is put to the operator with that quote.
Anything else is a claim without evidence: a P1 value is put to the operator as a
confirmation question (the agent's input parser keeps it pending), a P2 value is dropped.
Either way an invented fact never reaches the risk rules.
"""

from __future__ import annotations

import re
from typing import Any

from diagnosis.agent.reading import Claim, Extraction
from packs.airport.agent.extraction import extract_fields, yes_or_no
from packs.airport.graph import AirportGraph

# Field types whose value a quote can be checked to state: the value is in the words.
STATED_TYPES = frozenset({"flight_no", "position", "number", "text"})


def find_quote(text: str, quote: str) -> tuple[int, int] | None:
    """Where the quote occurs in the text, ignoring case and runs of whitespace."""
    words = quote.strip().split()
    if not words:
        return None
    pattern = r"\s+".join(re.escape(word) for word in words)
    match = re.search(pattern, text, flags=re.IGNORECASE)
    return match.span() if match else None


def _same(field_type: str, a: Any, b: Any) -> bool:
    if field_type in ("flight_no", "position"):
        return str(a).replace(" ", "").upper() == str(b).replace(" ", "").upper()
    if field_type == "number":
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return False
    return bool(a == b and type(a) is type(b))


def _valid(spec: dict[str, Any], value: Any, graph: AirportGraph) -> Any:
    """The value in the form the agent stores, or None when the scenario cannot take it."""
    kind = spec["type"]
    if kind == "enum":
        return value if str(value) in (spec.get("values") or {}) else None
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if kind == "position":
        node = graph.resolve(str(value))
        if node is None or node.kind not in spec.get("kinds", [node.kind]):
            return None
        return str(value).replace(" ", "").upper()
    if kind == "flight_no":
        return str(value).replace(" ", "").upper() or None
    if kind == "number":
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    return str(value).strip() or None


def ground(
    definition: dict[str, Any],
    text: str,
    graph: AirportGraph,
    claims: dict[str, Claim],
    asked: str | None = None,
) -> dict[str, Extraction]:
    """The model's claims with their verdict: confirmed with evidence, or unconfirmed."""
    fields: dict[str, dict[str, Any]] = definition["fields"]
    denied: dict[str, list[tuple[int, int]]] = {}
    synonyms = extract_fields(definition, text, graph, asked, denied_spans=denied)
    other_spans = {
        name: found.span for name, found in synonyms.items() if found.confirmed and found.span
    }
    result: dict[str, Extraction] = {}
    for name, claim in claims.items():
        spec = fields.get(name)
        if spec is None or claim.value is None:
            continue
        value = _valid(spec, claim.value, graph)
        if value is None:
            continue  # not a value of this scenario: nothing to confirm
        found = synonyms.get(name)
        # What the words themselves state of this field (an unconfirmed reading is none).
        known = found if found is not None and found.confirmed else None
        words_state = known is not None
        if known is not None and _same(spec["type"], known.value, value):
            result[name] = Extraction(value, known.evidence, span=known.span)
            continue
        span = find_quote(text, claim.quote)
        quoted = text[span[0] : span[1]] if span else ""
        quote_states = False
        if span and spec["type"] in STATED_TYPES:
            overlaps = [
                other
                for other, (start, end) in other_spans.items()
                if other != name and start < span[1] and span[0] < end
            ]
            states_value = spec["type"] == "text" or (
                str(claim.value).replace(" ", "").lower() in quoted.replace(" ", "").lower()
            )
            in_doubt = any(start < span[1] and span[0] < end for start, end in denied.get(name, []))
            quote_states = not overlaps and states_value and not in_doubt
        if known is not None and not quote_states:
            # The words state another value and nothing in them states the model's: the
            # reporter's words win over a model's guess ("CA1234 105机位 燃油泄漏" read as
            # MU9999 / 106 / HYDRAULIC), and the dropped value is noted.
            result[name] = Extraction(known.value, known.evidence, known.span, dropped=value)
            continue
        if quote_states and not words_state:
            result[name] = Extraction(value, quoted, span=span)
            continue
        # No synonym and no quote of its own ties the value to the text, or the words
        # state both values: the operator decides.
        result[name] = Extraction(value, quoted, span=span, confirmed=False)
    # What the synonyms read of a field the model said nothing about counts as it does
    # with the offline provider: a model that leaves out the flight the operator just
    # gave ("CA1234", answering "which flight?") does not make the agent ask again.
    for name, found in synonyms.items():
        if name not in result and (claims.get(name) is None or claims[name].value is None):
            result[name] = found
    return result


def confirmation_answer(spec: dict[str, Any], candidate: Any, text: str) -> Extraction | None:
    """A yes/no to "please confirm <field> = <candidate>", bare or opening a longer answer
    ("是，左发吸入"): yes takes the candidate; no takes the other value of a bool field, and
    nothing for other fields (the field is then asked plainly)."""
    said = yes_or_no(text)
    if said is True:
        return Extraction(candidate, f"confirmed: {text.strip()}")
    if said is False and spec["type"] == "bool" and isinstance(candidate, bool):
        return Extraction(not candidate, f"denied: {text.strip()}")
    return None


def settle(
    definition: dict[str, Any],
    found: dict[str, Extraction],
    pending: dict[str, dict[str, Any]],
    asked: str | None,
    text: str,
    declined: dict[str, list[Any]] | None = None,
) -> list[tuple[str, Extraction]]:
    """What one message establishes, in order: the answer to a confirmation question
    first (a yes/no about the pending value), then every reading; unconfirmed P2
    readings are dropped (only P1 fields are worth a question).

    Any answer to a confirmation question but a yes settles it: the pending value is
    removed from `pending` and noted in `declined`, and a reading of that same value
    with no evidence of its own is not put to the operator again (no question twice
    without new information): the field is then asked plainly."""
    fields: dict[str, dict[str, Any]] = definition["fields"]
    found = dict(found)
    declined = {} if declined is None else declined
    if asked and asked in pending:
        answer = confirmation_answer(fields[asked], pending[asked]["value"], text)
        words = found.get(asked)
        # A reading with a span is the words stating a value; a bare yes/no has none.
        if words is not None and words.confirmed and words.span is not None:
            # The answer states the value itself ("不是，航班号是CA1234"): taken as said.
            if not _same(fields[asked]["type"], words.value, pending[asked]["value"]):
                declined.setdefault(asked, []).append(pending[asked]["value"])
        elif answer is not None:
            found[asked] = answer
        else:
            declined.setdefault(asked, []).append(pending.pop(asked)["value"])
    return [
        (name, extraction)
        for name, extraction in found.items()
        if name in fields
        and (extraction.confirmed or fields[name].get("priority") == "P1")
        and not (
            not extraction.confirmed
            and _among(fields[name]["type"], extraction.value, declined.get(name, []))
        )
    ]


def _among(field_type: str, value: Any, values: list[Any]) -> bool:
    return any(_same(field_type, value, other) for other in values)
