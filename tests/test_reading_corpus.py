"""Issue 32, item 1: a generated corpus of operator statements, read by the offline
extractor. For every apron scenario shipped in scenarios_admin/data/scenarios (so a new
scenario gets its corpus for free) and each language: every enum and yes/no field's
synonyms, in every order of the fields, joined by each joiner of
scenarios_admin/data/reading_corpus.yaml (nothing, a space, a comma, 然后 / and ...),
plain and with a denial, a doubt or an end word attached to one statement. Each reading
is checked: a governed statement is not read, its neighbours are read as written.

The full product is large (every synonym choice per field), so cases are sampled
deterministically: each (order, joiner, modifier) combination once with synonyms taken
round-robin, so every synonym of every field is used. The number of cases each test
checks is asserted below (CASES_AT_LEAST) and printed on failure."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pytest

from packs.airport.agent.extraction import CJK, extract_fields
from scenarios_admin.builtin import DATA_DIR, read_yaml
from tests.builtin_data import demo_graph

CORPUS = read_yaml(DATA_DIR / "reading_corpus.yaml")
SCENARIOS = {
    path.stem: definition
    for path in sorted((DATA_DIR / "scenarios").glob("*.yaml"))
    if (definition := read_yaml(path))["kind"] == "apron"
}
# Fewer would mean the generator lost its combinations (tire burst, 3 fields: 447 in
# Chinese, 456 in English; the others about 2,400 each: 10,455 in all, 57 skipped).
CASES_AT_LEAST = 400


@dataclass(frozen=True)
class Statement:
    field: str
    value: Any
    synonym: str
    before: str = ""  # a denial or a doubt
    after: str = ""  # an end word

    @property
    def governed(self) -> bool:
        return bool(self.before or self.after)


def value_of(spec: dict[str, Any], raw: str) -> Any:
    return raw == "true" if spec["type"] == "bool" else raw


def synonyms_by_field(definition: dict[str, Any], language: str) -> dict[str, list[tuple]]:
    """Each enum/yes-no field's synonyms of one language, as (value, synonym)."""
    found: dict[str, list[tuple[Any, str]]] = {}
    for name in definition["field_order"]:
        spec = definition["fields"][name]
        if spec["type"] not in ("enum", "bool"):
            continue
        words = [
            (value_of(spec, raw), str(synonym))
            for raw, value_spec in spec["values"].items()
            for synonym in value_spec.get("synonyms", [])
            if bool(CJK.search(str(synonym))) == (language == "zh")
        ]
        if words:
            found[name] = words
    return found


def every_synonym(definition: dict[str, Any]) -> list[str]:
    return [
        str(synonym).lower()
        for spec in definition["fields"].values()
        if spec["type"] in ("enum", "bool")
        for value_spec in spec["values"].values()
        for synonym in [*value_spec.get("synonyms", []), *value_spec.get("fallback", [])]
    ]


def cases(slug: str, language: str) -> list[tuple[str, list[Statement]]]:
    definition = SCENARIOS[slug]
    words = synonyms_by_field(definition, language)
    corpus = CORPUS[language]
    # English words are written apart; Chinese ones run on.
    gap = " " if language == "en" else ""
    modifiers: list[tuple[str, str]] = [("", "")]
    modifiers += [(w + gap, "") for w in [*corpus["denials"], *corpus["doubts"]]]
    modifiers += [("", gap + w) for w in corpus["ends"]]
    turn = dict.fromkeys(words, 0)
    generated = []
    for order in itertools.permutations(words):
        for joiner, (before, after), governed in itertools.product(
            corpus["joiners"], modifiers, range(len(order))
        ):
            if not (before or after) and governed:
                continue  # a plain case once per order and joiner
            statements = []
            for index, name in enumerate(order):
                value, synonym = words[name][turn[name] % len(words[name])]
                turn[name] += 1
                mine = index == governed
                statements.append(
                    Statement(
                        name,
                        value,
                        synonym,
                        before if mine else "",
                        after if mine else "",
                    )
                )
            generated.append(
                (joiner.join(s.before + s.synonym + s.after for s in statements), statements)
            )
    return generated


def placed_spans(text: str, joiner: str, statements: list[Statement]) -> list[tuple[int, int]]:
    spans, at = [], 0
    for s in statements:
        at += len(s.before)
        spans.append((at, at + len(s.synonym)))
        at += len(s.synonym) + len(s.after) + len(joiner)
    return spans


def unambiguous(definition: dict[str, Any], text: str, spans: list[tuple[int, int]]) -> bool:
    """Only the synonyms placed are in the text: a joiner or a modifier word glued to a
    synonym can make another one ("没有" + "吸入" is bird strike's "没有吸入", a no)."""
    lowered = text.lower()
    for synonym in every_synonym(definition):
        start = lowered.find(synonym)
        while start != -1:
            end = start + len(synonym)
            latin = not CJK.search(synonym)
            whole = not latin or (
                (start == 0 or not lowered[start - 1].isalnum())
                and (end == len(lowered) or not lowered[end].isalnum())
            )
            if whole and not any(a <= start and end <= b for a, b in spans):
                return False
            start = lowered.find(synonym, start + 1)
    return True


def expected(
    definition: dict[str, Any], language: str, joiner: str, statements: list[Statement]
) -> dict[str, tuple[Any, bool]]:
    """The reading the rules call for. Besides the governed statement: with nothing
    between them, a Chinese yes/no synonym right before another field's synonym is an
    aspect word of it ("仍在运转"): one statement, read unconfirmed (a "no" aspect word,
    "不再运转", leaves the other unread); what governs either part governs both."""
    fields = definition["fields"]
    pairs = [
        (i, i + 1)
        for i in range(len(statements) - 1)
        if language == "zh"
        and joiner == ""
        and not statements[i].after
        and not statements[i + 1].before
        and fields[statements[i].field]["type"] == "bool"
    ]
    governed = {i for i, s in enumerate(statements) if s.governed}
    spread = True
    while spread:
        spread = False
        for a, b in pairs:
            if (a in governed) != (b in governed):
                governed |= {a, b}
                spread = True
    aspect_of = {a: b for a, b in pairs if a not in governed}
    negated = {b for a, b in aspect_of.items() if statements[a].value is False}
    reading: dict[str, tuple[Any, bool]] = {}
    for i, s in enumerate(statements):
        if i in governed or i in negated:
            continue
        reading[s.field] = (s.value, i not in aspect_of)
    return reading


@pytest.mark.parametrize(
    ("slug", "language"), [(slug, lang) for slug in SCENARIOS for lang in ("zh", "en")]
)
def test_every_statement_is_read_by_its_own_words(slug: str, language: str) -> None:
    definition = SCENARIOS[slug]
    graph = demo_graph()
    checked, skipped, wrong = 0, 0, []
    for text, statements in cases(slug, language):
        joiner = next(
            j
            for j in CORPUS[language]["joiners"]
            if text == j.join(s.before + s.synonym + s.after for s in statements)
        )
        if not unambiguous(definition, text, placed_spans(text, joiner, statements)):
            skipped += 1
            continue
        want = expected(definition, language, joiner, statements)
        found = extract_fields(definition, text, graph)
        got = {
            s.field: (found[s.field].value, found[s.field].confirmed)
            for s in statements
            if s.field in found
        }
        checked += 1
        if got != want:
            wrong.append(f"{text!r}: read {got}, expected {want}")
    assert checked >= CASES_AT_LEAST, (checked, skipped)
    assert wrong == [], f"{len(wrong)} of {checked} misread:\n" + "\n".join(wrong[:20])


def test_the_issues_phone_typed_statements_are_read_each_on_its_own() -> None:
    """The regression of issue 32: "已止住" after "已关车" is the leak's, not the engine's
    end, with spaces, with nothing between, or a comma."""
    definition = SCENARIOS["oil_spill"]
    for text in (
        "CA1234 105机位有煤油泄漏 已关车 已止住",
        "CA1234 105机位有煤油泄漏已关车已止住",
        "CA1234 105机位有煤油泄漏，已关车，已止住",
        "CA1234 105机位有煤油泄漏 已关车然后已止住",
    ):
        found = extract_fields(definition, text, demo_graph())
        assert {n: found[n].value for n in ("fluid_type", "engine_status", "continuous")} == {
            "fluid_type": "FUEL",
            "engine_status": "STOPPED",
            "continuous": False,
        }, text
    # An end word in its own statement is still that statement's: the engine has stopped
    # running, so "running" is no reading (asked), and the leak is read.
    for text in ("发动机运转已经停了 还在漏", "发动机运转 已经停了 还在漏"):
        found = extract_fields(definition, text, demo_graph())
        assert "engine_status" not in found and found["continuous"].value is True, text
