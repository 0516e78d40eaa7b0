"""Deterministic field extraction with the scenario's synonyms (the offline provider).

Matching is case-insensitive. Longer synonyms claim their span first, so "stopped
leaking" is never read as the engine being "stopped" and "未关车" never as "关车".
Latin synonyms must stand as whole words; Chinese ones match anywhere.

A span evidences one field only. A Chinese synonym of a bool field placed directly
before another field's synonym is an aspect word of that phrase ("仍在运转": the engine
is still running; "不再运转": no longer running), not a statement about its own field:
the phrase is the other field's evidence, and the bool field gets at most an unconfirmed
reading that the agent puts to the operator (an ambiguous P1 value is confirmed, never
assumed). A negating aspect word ("不再") also leaves the other field unread.

A synonym denied or doubted in its own clause ("没有吸入发动机", "there is no tire debris",
"not sure the engine is running") is no evidence of its value: the field stays unread
and the agent asks. Never the opposite value either: "不确定是否关车" states nothing, and
for an enum "not fuel" names no other fluid. A denial word inside another synonym
("不断", "未关车", "no longer leaking") is that synonym's own, not a denial.

Likewise a synonym whose own clause says right after it that it has ended ("发动机运转
已经停了", "运转停止了", "smoke has stopped") is no evidence of its value: read as the
value, the engine "has stopped running" was read as running. The field stays unread and
the agent asks.

Each synonym's value is decided by its own statement: a denial, a doubt or an end word
governs only the synonym of the statement it is in. A statement ends at punctuation, a
conjunction (然后, and), and where another field's synonym begins: in "有煤油泄漏 已关车
已止住" (typed on a phone, spaces for commas) the leak's "已止住" is not the engine's end,
nor in "已关车已止住". A space alone ends nothing: "发动机运转 已经停了" has no synonym after
the space, so its end word is the engine's (no reading; the agent asks). An aspect word
and the synonym it modifies ("仍在运转") are one statement: what governs either governs
both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from diagnosis.agent.reading import CJK, Extraction, occurrences
from packs.airport.graph import RUNWAY_DESIGNATOR, AirportGraph

# Airline code (2 chars, at least one letter) + 1-4 digits: CA1234, 3U8888, 9C8521.
FLIGHT_NO = re.compile(
    r"(?<![A-Za-z0-9])((?:[A-Za-z][A-Za-z0-9]|[0-9][A-Za-z])[0-9]{1,4})(?![0-9A-Za-z])"
)
# Aircraft types (A320, B737-800, C919, E190) fit the flight number format: never a flight.
AIRCRAFT_TYPE = re.compile(r"^(?:A[23][0-9]{2}|B7[0-9]{2}|C9[0-9]{2}|E1[0-9]{2})$")
NUMBER = r"(\d+(?:\.\d+)?)"
# Denial and doubt before a synonym, in the same clause: within DENIAL_WINDOW characters
# in Chinese ("没有发现碎片": 没 four characters back), within DENIAL_WINDOW words in
# English ("has not been shut down"). Not 非: "非常大面积" is very large, not "not large".
DENIAL_ZH = re.compile(r"[没未不无否别]")
DENIAL_EN = re.compile(
    r"(?<![a-z])(?:not|no|never|without|nor|cannot|unsure|unclear|unknown|whether|if"
    r"|[a-z]+n(?:'|\u2019)t)(?![a-z])"
)
CLAUSE_BREAK = re.compile(
    r"[，。；：！？、,.;:!?\n()（）]|但|而|并且|然后|随后|接着"
    r"|(?<![a-z])(?:but|and|then|while|though|although|however|yet)(?![a-z])"
)
DENIAL_WINDOW = 4
# A state said to have ended, right after its synonym in the same clause: within
# DENIAL_WINDOW characters in Chinese ("运转已经停了"; not "关车后漏油停了", the leak's),
# the next CEASED_WORDS words in English ("smoke has stopped"). Not a bare 停: "停在105
# 机位" is parked at stand 105.
CEASED_ZH = re.compile(r"停了|停止|已停|停下|停住|止住|结束|熄灭|没了|消失")
CEASED_EN = re.compile(r"(?<![a-z])(?:stopped|ceased|ended|extinguished|gone|died)(?![a-z])")
CEASED_WORDS = 3

YES = ("是", "是的", "对", "有", "yes", "y", "true", "affirmative")
NO = ("否", "不是", "没有", "无", "no", "n", "false", "negative")
# A yes or a no that opens a longer answer ("是，左发吸入", "不是，航班号是CA1234", "yes, the
# left engine"): the first word answers the question, the rest is read as any message.
# Chinese words end at punctuation or a space, English ones at punctuation only: "no
# debris" is a synonym's phrase, not "no" followed by a remark.
_LEAD_END_ZH = r"(?=$|[\s，。,.!！;；:：、])"
_LEAD_END_EN = r"(?=$|\s*[,.!;:])"
YES_LEAD = re.compile(
    rf"^(?:(?:是的|是|对的|对|没错){_LEAD_END_ZH}|(?:yes|yeah|yep|correct|affirmative){_LEAD_END_EN})"
)
NO_LEAD = re.compile(
    rf"^(?:(?:不是|不对|否|没有){_LEAD_END_ZH}|(?:no|nope|negative|wrong){_LEAD_END_EN})"
)
# An answer that says the operator does not know: nothing is read from it, and the
# question comes again saying why it is needed (nodes.reasoning).
UNSURE = re.compile(
    r"不知道|不清楚|不确定|无法确认|没法确认|看不到|看不清|说不准|不了解|未知"
    r"|(?<![a-z])(?:unknown|not sure|unsure|no idea|dunno"
    r"|(?:don'?t|do not|can'?t|cannot) (?:know|tell|see))(?![a-z])"
)


def is_unsure(text: str) -> bool:
    return UNSURE.search(text.lower()) is not None


def yes_or_no(text: str) -> bool | None:
    """The answer to a yes/no question: a bare yes or no, or one that opens a longer
    answer; None when the text starts with neither."""
    answer = text.lower().strip(" 。.!！,，")
    if answer in YES:
        return True
    if answer in NO:
        return False
    if YES_LEAD.match(answer):
        return True
    if NO_LEAD.match(answer):
        return False
    return None


@dataclass(frozen=True)
class _Match:
    start: int
    end: int
    field: str
    value: Any
    synonym: str
    weak: bool


def extract_fields(
    definition: dict[str, Any],
    text: str,
    graph: AirportGraph,
    asked: str | None = None,
    *,
    denied_spans: dict[str, list[tuple[int, int]]] | None = None,
) -> dict[str, Extraction]:
    """Every field value the text states. `asked` is the field the agent just asked for:
    a bare answer ("105", "yes") is read as that field. `denied_spans`, if given, gets
    per field the spans of its synonyms that a denial, a doubt or an end governs: no
    evidence of that field's value, whoever quotes them (grounding asks the operator)."""
    fields: dict[str, dict[str, Any]] = definition["fields"]
    found: dict[str, Extraction] = {}
    lowered = text.lower()
    claimed = _claimed(fields, text, lowered)
    by_start = {m.start: m for m in claimed}
    # An aspect word and the synonym it modifies: one statement (module docstring).
    pairs: list[tuple[_Match, _Match]] = []
    for word in claimed:
        head = by_start.get(word.end)
        if (
            head is not None
            and head.field != word.field
            and fields[word.field]["type"] == "bool"
            and CJK.search(word.synonym)
        ):
            pairs.append((word, head))
    governed = {id(m) for m in _denied(lowered, claimed)}
    spread = True
    while spread:  # through chains ("仍在持续运转"): each pair once more until none spreads
        spread = False
        for word, head in pairs:
            if (id(word) in governed) != (id(head) in governed):
                governed |= {id(word), id(head)}
                spread = True
    if denied_spans is not None:
        for reading in claimed:
            if id(reading) in governed:
                denied_spans.setdefault(reading.field, []).append((reading.start, reading.end))
    claimed = [m for m in claimed if id(m) not in governed]
    aspects = {id(word): head for word, head in pairs if id(word) not in governed}
    # A negating aspect word ("不再运转") says the other field's value no longer holds.
    negated = {id(aspects[id(w)]) for w in claimed if id(w) in aspects and w.value is False}

    chosen: dict[str, Extraction] = {}
    weak_hits: dict[str, Extraction] = {}
    unconfirmed: dict[str, Extraction] = {}
    for hit in claimed:  # still longest first, later first
        if id(hit) in negated:
            continue
        head = aspects.get(id(hit))
        if head is not None:
            phrase = (hit.start, head.end)
            unconfirmed.setdefault(
                hit.field,
                Extraction(hit.value, text[phrase[0] : phrase[1]], phrase, confirmed=False),
            )
            continue
        extraction = Extraction(hit.value, hit.synonym, (hit.start, hit.end))
        if hit.weak:
            weak_hits.setdefault(hit.field, extraction)
        else:
            chosen.setdefault(hit.field, extraction)
    found.update(chosen)
    for name, extraction in [*weak_hits.items(), *unconfirmed.items()]:
        found.setdefault(name, extraction)

    for name, spec in fields.items():
        if spec["type"] == "enum" and "measure" in spec and name not in found:
            measured = _measure(spec["measure"], lowered)
            if measured:
                found[name] = measured
        elif spec["type"] == "flight_no":
            flight = _flight_no(text, graph, _measured_spans(fields, text))
            if flight:
                found[name] = flight
        elif spec["type"] == "position":
            position = _position(
                text, graph, spec.get("kinds", ["stand", "taxiway", "runway"]), bare=True
            )
            if position:
                found[name] = position
        elif spec["type"] == "number" and asked == name:
            match = re.search(NUMBER, text)
            if match:
                found[name] = Extraction(float(match.group(1)), match.group(0), match.span())
        elif spec["type"] == "text" and asked == name and text.strip():
            found[name] = Extraction(text.strip(), "answer")

    if asked and asked not in found and fields.get(asked, {}).get("type") == "bool":
        said = yes_or_no(text)
        if said is not None:
            found[asked] = Extraction(said, text.strip(" 。.!！,，"))
    return found


def _claimed(fields: dict[str, dict[str, Any]], text: str, lowered: str) -> list[_Match]:
    """The synonym readings of the text: each span read once, longest synonym first."""
    candidates: list[_Match] = []
    for name, spec in fields.items():
        if spec["type"] not in ("enum", "bool"):
            continue
        for raw_value, value_spec in spec.get("values", {}).items():
            value: Any = _coerce(spec["type"], raw_value)
            for weak, synonyms in (
                (False, value_spec.get("synonyms", [])),
                (True, value_spec.get("fallback", [])),
            ):
                for synonym in synonyms:
                    for start in occurrences(lowered, str(synonym).lower()):
                        end = start + len(synonym)
                        candidates.append(_Match(start, end, name, value, text[start:end], weak))
    # Longest synonym first; on equal length the later mention wins (corrections). Weak
    # (fallback) synonyms come last: they never take a span from a named value
    # ("液压油料泄漏" names hydraulic fluid, not an unspecified 油料泄漏).
    candidates.sort(key=lambda m: (m.weak, -(m.end - m.start), -m.start))
    claimed: list[_Match] = []
    for candidate in candidates:
        if any(candidate.start < c.end and c.start < candidate.end for c in claimed):
            continue
        claimed.append(candidate)
    return claimed


def _denied(lowered: str, claimed: list[_Match]) -> list[_Match]:
    """The readings a denial or a doubt governs, or that their statement says have ended
    (see the module's docstring). A reading's statement runs from the last break or the
    end of another field's synonym before it to the next break or the start of another
    field's synonym after it: a later word of the same field is still about it ("the
    engine running has stopped")."""
    breaks = [m.span() for m in CLAUSE_BREAK.finditer(lowered)]
    denied = []
    for match in claimed:
        start = max(
            [end for _, end in breaks if end <= match.start]
            + [m.end for m in claimed if m.end <= match.start and m.field != match.field]
            + [0]
        )
        end = min(
            [begin for begin, _ in breaks if begin >= match.end]
            + [m.start for m in claimed if m.start >= match.end and m.field != match.field]
            + [len(lowered)]
        )
        before = lowered[start : match.start]
        words = " ".join(before.split()[-DENIAL_WINDOW:])
        if DENIAL_ZH.search(before[-DENIAL_WINDOW:]) or DENIAL_EN.search(words):
            denied.append(match)
            continue
        after = lowered[match.end : end]
        following = " ".join(after.split()[:CEASED_WORDS])
        # A space typed before the end word is no part of the window ("运转 已经停了").
        if CEASED_ZH.search(after.lstrip()[:DENIAL_WINDOW]) or CEASED_EN.search(following):
            denied.append(match)
    return denied


def _coerce(field_type: str, raw: str) -> Any:
    if field_type == "bool":
        return str(raw).lower() == "true"
    return raw


def _measure_pattern(measure: dict[str, Any]) -> str:
    units = "|".join(re.escape(u.lower()) for u in sorted(measure["units"], key=len, reverse=True))
    return NUMBER + r"\s*(?:" + units + r")"


def _measured_spans(fields: dict[str, dict[str, Any]], text: str) -> list[tuple[int, int]]:
    """Where the text states a measurement ("6m2"), which no flight number overlaps."""
    return [
        match.span()
        for spec in fields.values()
        if "measure" in spec
        for match in re.finditer(_measure_pattern(spec["measure"]), text, flags=re.IGNORECASE)
    ]


def _measure(measure: dict[str, Any], lowered: str) -> Extraction | None:
    match = re.search(_measure_pattern(measure), lowered)
    if not match:
        return None
    amount = float(match.group(1))
    for band in measure["bands"]:
        if "above" in band and not amount > band["above"]:
            continue
        if "at_least" in band and not amount >= band["at_least"]:
            continue
        return Extraction(band["value"], match.group(0), match.span())
    return None


def _flight_no(
    text: str, graph: AirportGraph, ignore: list[tuple[int, int]] | None = None
) -> Extraction | None:
    matches = [
        (m.group(1).upper(), m.span(1))
        for m in FLIGHT_NO.finditer(text)
        if not any(m.start() < end and start < m.end() for start, end in ignore or [])
        and not AIRCRAFT_TYPE.match(m.group(1).upper())
    ]
    # Node ids such as "A10" or "R0624" look like flight numbers; prefer a known flight,
    # then anything that is not a node of the airport.
    for candidate, span in matches:
        if candidate in graph.flights:
            return Extraction(candidate, candidate, span)
    for candidate, span in matches:
        if candidate not in graph.nodes:
            return Extraction(candidate, candidate, span)
    return None


def _position(text: str, graph: AirportGraph, kinds: list[str], *, bare: bool) -> Extraction | None:
    """Explicit forms first (105机位, 机位105, 105号机位, stand 105, 滑行道B2, B2滑行道,
    taxiway B2, 跑道06/24, runway 06/24), then a bare id that names a node."""
    token = r"([A-Za-z]?\d{1,4}[A-Za-z]?)"
    patterns: list[tuple[str, str]] = []
    if "stand" in kinds:
        patterns += [
            (r"机位\s*" + token, "stand"),
            (token + r"\s*号?\s*机位", "stand"),
            (r"(?<![a-z])stand\s*(?:no\.?\s*)?" + token, "stand"),
            (r"(?<![a-z])gate\s*" + token, "stand"),
        ]
    if "taxiway" in kinds:
        patterns += [
            (r"滑行道\s*" + token, "taxiway"),
            (token + r"\s*滑行道", "taxiway"),
            (r"(?<![a-z])taxiway\s*" + token, "taxiway"),
        ]
    if "runway" in kinds:
        designator = r"(\d{2}[LCR]?\s*/\s*\d{2}[LCR]?)"
        patterns += [
            (r"跑道\s*" + designator, "runway"),
            (designator + r"\s*跑道", "runway"),
            (r"(?<![a-z])(?:runway|rwy)\s*" + designator, "runway"),
        ]
    for pattern, kind in patterns:
        for match in re.finditer(pattern, text, flags=re.IGNORECASE):
            ref = re.sub(r"\s+", "", match.group(1)).upper()
            node = graph.resolve(ref)
            if node is not None and node.kind == kind:
                return Extraction(ref, match.group(0).strip(), match.span())
    if not bare:
        return None
    for match in re.finditer(
        r"(?<![A-Za-z0-9/])([A-Za-z]?\d{1,4}(?:/\d{2})?)(?![0-9A-Za-z/])", text
    ):
        ref = match.group(1).upper()
        node = graph.resolve(ref)
        if node is None or node.kind not in kinds:
            continue
        if node.kind == "runway" and not RUNWAY_DESIGNATOR.match(ref):
            continue  # a raw runway node id is not how people name a runway
        return Extraction(ref, match.group(0), match.span())
    return None
