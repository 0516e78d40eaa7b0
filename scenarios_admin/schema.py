"""Scenario definitions as pydantic models: the one validation of a definition.

A definition is a discriminated union on `kind` over the definition models of the
installed domain packs (aero.packs). This module holds the envelope every kind shares
(slug, names, fields, report template, budget) and the union; how pydantic's errors
become the problems users read is scenarios_admin.validation.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, ClassVar, Union

from django.template import Engine, TemplateSyntaxError
from pydantic import (
    BeforeValidator,
    Field,
    GetJsonSchemaHandler,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from aero.packs import installed_packs
from scenarios_admin.definition import LANGUAGES, PRIORITIES, RESERVED_FIELD_NAMES, Issue
from scenarios_admin.validation import (
    Loc,
    OneOf,
    Part,
    Problems,
    Text,
    also,
    document_fields,
    fail,
    in_document_order,
    is_int,
    is_number,
    is_text,
    message_of,
    not_null,
    shape,
    values_of,
    word_list,
)

_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]*")
_VALUE_NAME = re.compile(r"[A-Za-z0-9_]+")


# --- parts -----------------------------------------------------------------------------------


class Texts(Part):
    """A text in each language, both required."""

    zh: Text
    en: Text


class OptionalTexts(Part):
    zh: str | None = None
    en: str | None = None


class ValueSpec(Part):
    missing_messages: ClassVar[dict[str, str]] = {"synonyms": "required (may be an empty list)"}

    label: OptionalTexts | None = None
    synonyms: Annotated[list[str], word_list("synonyms")]
    fallback: Annotated[list[str] | None, word_list("synonyms")] = None


class Band(Part):
    above: Annotated[float | None, not_null("must be a number")] = None
    at_least: Annotated[float | None, not_null("must be a number")] = None
    value: str

    @classmethod
    def check(cls, data: dict[str, Any], problems: Problems, info: ValidationInfo) -> None:
        if "above" in data and "at_least" in data:
            problems.add((), "give either above or at_least, not both")


class Measure(Part):
    """How a number the reporter gives picks an enum value (`bands`), and its units."""

    units: Annotated[list[str], word_list("units")]
    bands: Annotated[list[Band], shape(list, "must be a non-empty list", non_empty=True)]

    @classmethod
    def check(cls, data: dict[str, Any], problems: Problems, info: ValidationInfo) -> None:
        if data.get("units") == []:
            problems.add(("units",), "name at least one unit")


# The field types every kind understands, with the row editor's labels.
CORE_FIELD_TYPES = {
    "enum": "one of listed values",
    "bool": "yes / no",
    "text": "free text",
    "number": "number",
}


class FieldSpec(Part):
    """A fact the agent collects from the reporter. A pack adds its own field types (and
    keys) by subclassing; these four every kind understands."""

    field_types: ClassVar[tuple[str, ...]] = tuple(CORE_FIELD_TYPES)

    label: Texts
    type: str
    priority: Annotated[str, OneOf(PRIORITIES, "{value} is not P1 or P2")]
    ask: OptionalTexts | None = None
    values: dict[str, ValueSpec] | None = None
    default: Annotated[str | None, not_null("must be text")] = None
    measure: Annotated[Measure | None, not_null("must be a mapping")] = None

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler.resolve_ref_schema(handler(schema))
        json_schema["properties"]["type"]["enum"] = list(cls.field_types)
        return json_schema

    @classmethod
    def check(cls, data: dict[str, Any], problems: Problems, info: ValidationInfo) -> None:
        field_type = data.get("type")
        if isinstance(field_type, str) and field_type not in cls.field_types:
            problems.add(("type",), f"{field_type!r} is not one of {', '.join(cls.field_types)}")
        ask = data.get("ask")
        if data.get("priority") == "P1":
            for lang in LANGUAGES:
                if not isinstance(ask, dict) or not is_text(ask.get(lang)):
                    problems.add(("ask", lang), "a P1 field needs an ask prompt")
        cls._values(data, field_type, problems)
        if isinstance(data.get("default"), str):
            if field_type != "enum":
                problems.add(("default",), "only enum fields have a default")
            elif data["default"] not in values_of(data):
                problems.add(("default",), f"{data['default']!r} is not one of its values")
        measure = data.get("measure")
        if "measure" in data and field_type != "enum":
            problems.add(("measure",), "only enum fields have a measure")
        elif isinstance(measure, dict) and isinstance(measure.get("bands"), list):
            for i, band in enumerate(measure["bands"]):
                value = band.get("value") if isinstance(band, dict) else None
                if isinstance(band, dict) and not (
                    isinstance(value, str) and value in values_of(data)
                ):
                    problems.add(
                        ("measure", "bands", i, "value"), f"{value!r} is not one of its values"
                    )

    @classmethod
    def _values(cls, data: dict[str, Any], field_type: Any, problems: Problems) -> None:
        values = data.get("values")
        if field_type not in ("enum", "bool"):
            if values is not None:
                problems.add(("values",), "only enum and bool fields have values")
            return
        if values is None or values == {}:
            problems.add(("values",), f"required for {field_type} fields")
            return
        if not isinstance(values, dict):
            return
        if field_type == "bool" and set(values) != {"true", "false"}:
            problems.add(("values",), "a bool field has exactly the values 'true' and 'false'")
        owner: dict[str, str] = {}
        for value, value_spec in values.items():
            if not isinstance(value, str) or not _VALUE_NAME.fullmatch(value):
                problems.add(("values", value), "a value is letters, digits and underscores only")
            if not isinstance(value_spec, dict):
                continue
            for key in ("synonyms", "fallback"):
                words = value_spec.get(key)
                if not isinstance(words, list):
                    continue
                for i, word in enumerate(words):
                    folded = str(word).casefold()
                    if folded in owner and owner[folded] != value:
                        problems.add(
                            ("values", value, key, i),
                            f"{word!r} is also a synonym of {owner[folded]}: the extractor "
                            "could not tell them apart",
                        )
                    owner.setdefault(folded, str(value))


class ReportTemplate(Part):
    """The report as a Django template per language (rendered without autoescape: the
    report is Markdown, escaped where it is shown)."""

    zh: Text
    en: Text

    @classmethod
    def check(cls, data: dict[str, Any], problems: Problems, info: ValidationInfo) -> None:
        for lang in LANGUAGES:
            source = data.get(lang)
            if not is_text(source):
                continue
            try:
                Engine(autoescape=False).from_string(str(source))
            except TemplateSyntaxError as exc:
                problems.add((lang,), f"does not compile: {exc}")


def _positive(whole: bool) -> BeforeValidator:
    def validate(value: Any) -> Any:
        if not is_number(value) or value <= 0 or (whole and not is_int(value)):
            fail("must be a positive whole number" if whole else "must be a positive number")
        return value

    return BeforeValidator(validate)


class Budget(Part):
    """A session's model budget (none set: unlimited): reasoning steps that ask the
    model, tokens in + out, and cost in the providers' currency."""

    steps: Annotated[int, _positive(whole=True)] | None = None
    tokens: Annotated[int, _positive(whole=True)] | None = None
    cost: Annotated[float, _positive(whole=False)] | None = None


def _slug(value: Any) -> Any:
    if not isinstance(value, str) or not _FIELD_NAME.fullmatch(value):
        fail("lower-case letters, digits and underscores only")
    return value


def _field_names(fields: Any, problems: Problems, info: ValidationInfo) -> None:
    if not isinstance(fields, dict):
        return
    for name in fields:
        if not _FIELD_NAME.fullmatch(str(name)) or name in RESERVED_FIELD_NAMES:
            problems.add(
                (name,),
                "a field name is lower-case letters, digits and underscores, and not one of "
                + ", ".join(RESERVED_FIELD_NAMES),
            )


def _field_order(order: Any, problems: Problems, info: ValidationInfo) -> None:
    fields = document_fields(info)
    if not isinstance(order, list) or fields is None:
        return
    seen: set[str] = set()
    for i, name in enumerate(order):
        if not isinstance(name, str):
            continue  # reported as not text
        if name not in fields:
            problems.add((i,), f"unknown field {name!r}")
        elif name in seen:
            problems.add((i,), f"field {name!r} is listed twice")
        else:
            seen.add(name)
    for name in fields:
        if name not in seen:
            problems.add((), f"field {name!r} is missing")


class DefinitionBase[SpecT: FieldSpec](Part):
    """What every scenario kind has. A pack's definition model subclasses it with its
    own field spec, `kind: Literal["<its kind>"]` and its own parts."""

    missing_first: ClassVar[bool] = True
    # The row editor's words for the kind (a kind edited as rows declares them): its own
    # field types with their labels (besides FieldSpec's), the lists its impact analysis
    # gives (an action's `for_each`, a condition's `impact.<list>`), and the kinds of node
    # of its world a field may resolve to.
    own_field_types: ClassVar[Mapping[str, str]] = {}
    impact_lists: ClassVar[tuple[str, ...]] = ()
    node_kinds: ClassVar[tuple[str, ...]] = ()
    # Its YAML file's top-level keys in order, the core's among them (scenarios_admin.yamlio);
    # empty: the core's, then its own.
    key_order: ClassVar[tuple[str, ...]] = ()

    slug: Annotated[str, BeforeValidator(_slug)]
    name: Texts
    kind: str
    system_prompt: str = ""
    field_order: Annotated[
        list[str], also(_field_order), shape(list, "must be a list of field names")
    ]
    fields: Annotated[
        dict[str, SpecT],
        also(_field_names),
        shape(dict, "must map field names to definitions", non_empty=True),
    ]
    report_template: ReportTemplate
    budget: Budget | None = None


# --- the union of the installed kinds ------------------------------------------------------


def row_words(name: str) -> tuple[str, ...]:
    """The installed packs' words under `name` (impact_lists, node_kinds, own_field_types:
    a ClassVar of their definition models), each once, in pack order: the row editor's
    choices and the canonical YAML's order."""
    return tuple(
        dict.fromkeys(
            word
            for pack in installed_packs()
            if pack.definition_model is not None
            for word in getattr(pack.definition_model, name)
        )
    )


def field_type_labels() -> dict[str, str]:
    """Every field type a row may have, with its label: the packs' own, then the core's."""
    labels: dict[str, str] = {}
    for pack in installed_packs():
        if pack.definition_model is not None:
            for name, label in pack.definition_model.own_field_types.items():
                labels.setdefault(name, label)
    return {**labels, **CORE_FIELD_TYPES}


def installed_kinds() -> list[str]:
    return sorted(pack.kind for pack in installed_packs() if pack.definition_model is not None)


@cache
def _adapter(models: tuple[type[DefinitionBase[Any]], ...]) -> TypeAdapter[Any]:
    union = Union[models]  # type: ignore[valid-type]  # noqa: UP007 (built at run time)
    return TypeAdapter(Annotated[union, Field(discriminator="kind")])


def definition_adapter() -> TypeAdapter[Any]:
    """A discriminated union on `kind` of the installed packs' definition models."""
    models = tuple(
        pack.definition_model
        for pack in sorted(installed_packs(), key=lambda p: p.kind)
        if pack.definition_model is not None
    )
    if not models:
        raise RuntimeError("no installed domain pack has a definition model")
    return _adapter(models)


def parse_definition(data: Any) -> DefinitionBase[Any]:
    """The definition as its kind's model; raises pydantic's ValidationError."""
    model: DefinitionBase[Any] = definition_adapter().validate_python(
        data, context={"document": data}
    )
    return model


def definition_issues(data: Any) -> list[Issue]:
    """Every problem of a definition, in the order of the document; empty = valid."""
    try:
        parse_definition(data)
    except ValidationError as exc:
        found: list[tuple[Loc, str]] = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
                loc = ("kind",)
            elif loc and isinstance(data, dict) and loc[0] == data.get("kind"):
                loc = loc[1:]  # the union's step into the kind's model
            found.append((loc, _kind_message(error) or message_of(error)))
        return in_document_order(data, found)
    return []


def _kind_message(error: Any) -> str | None:
    if error["type"] == "union_tag_not_found":
        return "required"
    if error["type"] == "union_tag_invalid":
        tag = (error.get("ctx") or {}).get("tag")
        return (
            f"{tag!r} is not one of {', '.join(installed_kinds())}: no installed domain pack "
            "serves that kind"
        )
    return None


def validate_definition(data: Any) -> list[str]:
    """Every problem, each as "path: message"; empty = valid."""
    return [str(issue) for issue in definition_issues(data)]


def definition_json_schema() -> dict[str, Any]:
    """The JSON Schema of a definition of any installed kind (for editors' hints)."""
    schema: dict[str, Any] = definition_adapter().json_schema()
    return schema
