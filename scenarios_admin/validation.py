"""Turning pydantic's validation into the problems users read: a path into the document
as in its YAML file (`risk_rules[3].when.fluid`) and what is wrong, every problem of a
document at once, listed in the order of the document.

A `Part` is a mapping of a definition: it reports keys it does not declare, and its
`check` sees the raw input whatever else is wrong, so one save reports every problem,
not one layer at a time. Rules that look across the document (a condition naming a field)
read the raw document from the validation context (`document(info)`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, NoReturn, Self

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, InitErrorDetails, PydanticCustomError, core_schema

from scenarios_admin.definition import LIST_SEPARATORS, Issue

Loc = tuple[str | int, ...]


# --- problems as pydantic errors ----------------------------------------------------------


def fail(message: str) -> NoReturn:
    """One problem at the place being validated. The message goes in as a context value,
    never as the template, so braces in it (`{fields.position}`) stay as written."""
    raise PydanticCustomError("definition", "{message}", {"message": message})


class Problems:
    """Problems found at several places below the value being validated."""

    def __init__(self) -> None:
        self.found: list[tuple[Loc, str]] = []

    def add(self, loc: Loc, message: str) -> None:
        self.found.append((loc, message))

    def extend(self, exc: ValidationError, missing: dict[str, str] | None = None) -> None:
        for error in exc.errors():
            loc = tuple(error["loc"])
            message = message_of(error)
            if error["type"] == "missing" and missing and len(loc) == 1 and loc[0] in missing:
                message = missing[str(loc[0])]
            self.add(loc, message)

    def raise_if_any(self) -> None:
        if self.found:
            raise ValidationError.from_exception_data(
                "definition",
                [
                    InitErrorDetails(
                        type=PydanticCustomError("definition", "{message}", {"message": m}),
                        loc=loc,
                        input=None,
                    )
                    for loc, m in self.found
                ],
            )


_TYPE_WORDS = {
    "string_type": "must be text",
    "bool_type": "must be true or false",
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
}


def message_of(error: Any) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "definition":
        return str(ctx["message"])
    if kind == "missing":
        return "required"
    if kind in _TYPE_WORDS:
        return _TYPE_WORDS[kind]
    return str(error["msg"])


def also(check: Callable[[Any, Problems, ValidationInfo], None]) -> WrapValidator:
    """Run `check` on the raw value besides the type's own validation, reporting both."""

    def validate(value: Any, handler: Callable[[Any], Any], info: ValidationInfo) -> Any:
        problems = Problems()
        result = None
        try:
            result = handler(value)
        except ValidationError as exc:
            problems.extend(exc)
        check(value, problems, info)
        problems.raise_if_any()
        return result

    return WrapValidator(validate)


def shape(kind: type, message: str, *, non_empty: bool = False) -> BeforeValidator:
    """Refuse a value that is not a `kind` (or is empty) with a message naming what it holds."""

    def validate(value: Any) -> Any:
        if not isinstance(value, kind) or (non_empty and not value):
            fail(message)
        return value

    return BeforeValidator(validate)


@dataclass(frozen=True)
class OneOf:
    """A text out of a fixed set, refused with `message` ("{value}": the value given)."""

    values: tuple[str, ...]
    message: str

    def check(self, value: Any) -> Any:
        if not (isinstance(value, str) and value in self.values):
            fail(self.message.replace("{value}", repr(value)))
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_before_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["enum"] = list(self.values)
        return json_schema


def not_null(message: str) -> BeforeValidator:
    """An optional key may be left out, but not given as null (`message`: what it must be)."""

    def validate(value: Any) -> Any:
        if value is None:
            fail(message)
        return value

    return BeforeValidator(validate)


def is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _non_blank(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        fail("required")
    return value


# Text that must say something (a blank one counts as missing).
Text = Annotated[str, BeforeValidator(_non_blank)]


def word_list(what: str) -> BeforeValidator:
    """A list of words an admin may also type into one box, split on commas and line
    breaks (scenarios_admin.draft): so no word may hold a separator."""

    def validate(value: Any) -> Any:
        if not isinstance(value, list):
            fail(f"must be a list of {what}")
        problems = Problems()
        for i, item in enumerate(value):
            if not is_text(item):
                problems.add((i,), f"must be a non-empty text, not {item!r}")
            elif LIST_SEPARATORS.search(item) or item != item.strip():
                problems.add(
                    (i,),
                    f"{item!r} contains a comma, a line break or surrounding spaces: "
                    f"give each of the {what} separately",
                )
        problems.raise_if_any()
        return value

    return BeforeValidator(validate)


# --- the document being validated -----------------------------------------------------------


def document(info: ValidationInfo) -> dict[str, Any]:
    """The raw definition being validated (validate_definition puts it in the context)."""
    context = info.context
    if not isinstance(context, dict) or "document" not in context:
        raise RuntimeError("validate definitions with scenarios_admin.schema.parse_definition")
    data: dict[str, Any] = context["document"]
    return data


def document_fields(info: ValidationInfo) -> dict[str, Any] | None:
    """The document's field specs by name, or None when they cannot be read (then checks
    that look fields up are skipped rather than reporting every name as unknown)."""
    fields = document(info).get("fields")
    return fields if isinstance(fields, dict) and fields else None


def spec_of(fields: dict[str, Any], name: Any) -> dict[str, Any]:
    spec = fields.get(name) if isinstance(name, str) else None
    return spec if isinstance(spec, dict) else {}


def values_of(spec: Any) -> dict[str, Any]:
    values = spec.get("values") if isinstance(spec, dict) else None
    return values if isinstance(values, dict) else {}


class Part(BaseModel):
    """A mapping of a definition. Keys it does not declare are reported (a misspelt key
    is an error, never ignored), and `check` sees the raw input whatever else is wrong."""

    # The JSON Schema says so too, so an editor flags a misspelt key as it is typed.
    model_config = ConfigDict(
        strict=True, frozen=True, json_schema_extra={"additionalProperties": False}
    )
    not_a_mapping: ClassVar[str] = "must be a mapping"
    # A required key's own "missing" wording, where "required" alone would not say enough.
    missing_messages: ClassVar[dict[str, str]] = {}
    # Whether missing required keys are reported alone (the rest would only cascade).
    missing_first: ClassVar[bool] = False

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(cls.model_fields)

    @model_validator(mode="wrap")
    @classmethod
    def _part(cls, data: Any, handler: Callable[[Any], Self], info: ValidationInfo) -> Self:
        if not isinstance(data, dict):
            fail(cls.not_a_mapping)
        keys = cls.keys()
        problems = Problems()
        for key in data:
            if key not in keys:
                problems.add((key,), f"unknown key (allowed: {', '.join(keys)})")
        if cls.missing_first:
            required = [k for k, f in cls.model_fields.items() if f.is_required()]
            for key in required:
                if key not in data:
                    problems.add((key,), "required")
            if len(problems.found) > sum(1 for key in data if key not in keys):
                problems.raise_if_any()
        result = None
        try:
            result = handler({k: v for k, v in data.items() if k in keys})
        except ValidationError as exc:
            problems.extend(exc, cls.missing_messages)
        cls.check(data, problems, info)
        problems.raise_if_any()
        assert result is not None
        return result

    @classmethod
    def check(cls, data: dict[str, Any], problems: Problems, info: ValidationInfo) -> None:
        """Rules across the part's keys, on the raw input (so written defensively)."""


def path_of(loc: Sequence[str | int]) -> str:
    """`risk_rules[3].when.fluid` for ("risk_rules", 3, "when", "fluid")."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "definition"


def in_document_order(data: Any, found: Iterable[tuple[Loc, str]]) -> list[Issue]:
    """Issues sorted by where they are in the document (a missing key: where its parent
    is), so a file's problems read top to bottom."""
    order: dict[Loc, int] = {}

    def walk(node: Any, loc: Loc) -> None:
        order[loc] = len(order)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*loc, key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, (*loc, i))

    walk(data, ())
    located: list[tuple[int, Loc, str]] = []
    for loc, message in found:
        place = loc
        while place and place not in order:
            place = place[:-1]
        located.append((order[place], loc, message))
    located.sort(key=lambda item: item[0])
    return [Issue(path_of(loc), message) for _, loc, message in located]
