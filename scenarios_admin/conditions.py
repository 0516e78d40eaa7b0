"""The readable condition text admins type, and its JSON form in a definition.

    fluid_type=FUEL, continuous=true          all must hold (`,` or AND)
    phase=TAKEOFF_ROLL|CLIMB                  one of several values
    phase!=STAND                              known and not equal
    position.kind=runway                      kind of the node a position resolves to
    impact.runways=non_empty                  an impact list is non-empty (or `empty`)
    level=HIGH OR remains_on_runway=true      either side holds
    level=HIGH, (debris=true OR fire=true)    a parenthesised OR group inside a part

Empty text means "always". `true`/`false` are booleans; every other value is text. The
JSON form is the `when` mapping of scenarios_admin.definition: `a=1|2` is `{a: [1, 2]}`,
`a!=1` is `{a: {not: 1}}`, an OR is `{any: [...]}`. `condition_text` renders a mapping
back so that `parse_condition(condition_text(when)) == when` for every valid `when`.
"""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(r"\s*(\(|\)|,|(?<!\S)(?:OR|AND)(?!\S))\s*", re.IGNORECASE)
_COMPARISON = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\s*(!=|=)\s*(.*)$")
# Characters a value may not contain: they separate parts of the text.
_RESERVED = re.compile(r"[,|()]|(?<!\S)(?:or|and)(?!\S)", re.IGNORECASE)


class ConditionSyntaxError(ValueError):
    pass


def parse_condition(text: str) -> dict[str, Any]:
    """The `when` mapping of a condition text; raises ConditionSyntaxError with what and where."""
    tokens = _tokenize(text)
    if not tokens:
        return {}
    parser = _Parser(tokens)
    branches = parser.expression()
    if parser.position < len(tokens):
        raise ConditionSyntaxError(f"unexpected {tokens[parser.position]!r}")
    return branches[0] if len(branches) == 1 else {"any": branches}


def condition_text(when: dict[str, Any]) -> str:
    if not when:
        return ""
    if set(when) == {"any"} and isinstance(when["any"], list) and len(when["any"]) >= 2:
        return " OR ".join(_conjunction_text(branch) for branch in when["any"])
    return _conjunction_text(when)


def value_is_representable(value: str) -> bool:
    """Whether a text value survives condition_text -> parse_condition unchanged."""
    return (
        bool(value)
        and value == value.strip()
        and not _RESERVED.search(value)
        and value.lower() not in ("true", "false")
    )


def _conjunction_text(when: dict[str, Any]) -> str:
    parts = []
    for key, expected in when.items():
        if key == "any":
            parts.append("(" + " OR ".join(_conjunction_text(b) for b in expected) + ")")
        elif isinstance(expected, dict) and "not" in expected:
            parts.append(f"{key}!={_values_text(expected['not'])}")
        else:
            parts.append(f"{key}={_values_text(expected)}")
    return ", ".join(parts)


def _values_text(expected: Any) -> str:
    items = expected if isinstance(expected, list) else [expected]
    return "|".join(_scalar_text(item) for item in items)


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    for match in _TOKEN.finditer(text):
        chunk = text[position : match.start()].strip()
        if chunk:
            tokens.append(chunk)
        delimiter = match.group(1)
        tokens.append(delimiter.upper() if delimiter.isalpha() else delimiter)
        position = match.end()
    rest = text[position:].strip()
    if rest:
        tokens.append(rest)
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.position = 0

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str:
        token = self.tokens[self.position]
        self.position += 1
        return token

    def expression(self) -> list[dict[str, Any]]:
        branches = [self.conjunction()]
        while self.peek() == "OR":
            self.take()
            branches.append(self.conjunction())
        return branches

    def conjunction(self) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while True:
            token = self.peek()
            if token is None or token in (",", "AND", "OR", ")"):
                where = f"before {token!r}" if token else "at the end"
                raise ConditionSyntaxError(f"a comparison such as field=VALUE is missing {where}")
            if token == "(":
                self.take()
                group = self.expression()
                if self.peek() != ")":
                    raise ConditionSyntaxError("a '(' is never closed")
                self.take()
                if "any" in result:
                    raise ConditionSyntaxError(
                        "only one (… OR …) group per part: combine them into one group"
                    )
                result["any"] = group
            else:
                key, expected = _comparison(self.take())
                if key in result:
                    raise ConditionSyntaxError(
                        f"{key} appears twice; write {key}=A|B for one of several values"
                    )
                result[key] = expected
            if self.peek() in (",", "AND"):
                self.take()
                continue
            return result


def _comparison(token: str) -> tuple[str, Any]:
    match = _COMPARISON.match(token)
    if not match:
        raise ConditionSyntaxError(
            f"{token!r} is not a comparison: write field=VALUE, field!=VALUE or field=A|B"
        )
    key, operator, raw = match.groups()
    values = [v.strip() for v in raw.split("|")]
    if any(not v for v in values):
        raise ConditionSyntaxError(f"{token!r}: a value is missing after {operator!r} or '|'")
    if any("=" in v for v in values):
        raise ConditionSyntaxError(f"{token!r}: separate comparisons with ',' or OR")
    typed: list[Any] = [_typed(v) for v in values]
    expected: Any = typed[0] if len(typed) == 1 else typed
    return key, ({"not": expected} if operator == "!=" else expected)


def _typed(value: str) -> Any:
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return value
