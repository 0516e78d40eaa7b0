"""Structured output: the reply schema of a scenario's extraction (pydantic, sent as the
json_schema response format) and the validation of a model's reply against it."""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from diagnosis.agent.reading import Claim
from diagnosis.agent.usage import ProviderError
from scenarios_admin.definition import value_order


def extraction_model(definition: dict[str, Any]) -> type[BaseModel]:
    """The reply schema for one scenario: per field an optional {value, quote}; enum values
    are the scenario's values. Sent as the json_schema response format and used to validate
    the reply. Built once per process and scenario fields: building the pydantic
    classes and their JSON schema was paid at every extraction, a resumed step included."""
    fields = [[name, definition["fields"][name]] for name in definition["field_order"]]
    return _extraction_model(json.dumps(fields, sort_keys=True, ensure_ascii=False))


def response_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """The json_schema response format of a reply schema (a copy of the cached one)."""
    return json.loads(_response_schema(schema))


@functools.lru_cache(maxsize=64)
def _response_schema(schema: type[BaseModel]) -> str:
    return json.dumps({"name": schema.__name__, "schema": schema.model_json_schema()})


@functools.lru_cache(maxsize=64)
def _extraction_model(fields_json: str) -> type[BaseModel]:
    pairs: list[tuple[str, dict[str, Any]]] = json.loads(fields_json)
    properties: dict[str, Any] = {}
    for name, spec in pairs:
        value_type: Any
        if spec["type"] == "enum":
            value_type = Literal[tuple(value_order(spec))]
        elif spec["type"] == "bool":
            value_type = bool
        elif spec["type"] == "number":
            value_type = float
        else:
            value_type = str
        item = create_model(
            f"Field_{name}",
            __config__=ConfigDict(extra="forbid"),
            value=(value_type, ...),
            quote=(
                str,
                Field(description="the operator's exact words that state this value"),
            ),
        )
        properties[name] = (
            item | None,
            Field(None, description=f"{spec['label']['en']} ({spec['type']})"),
        )
    model: type[BaseModel] = create_model(
        "ExtractedFields",
        __config__=ConfigDict(extra="ignore", protected_namespaces=()),
        **properties,
    )
    return model


def parse_reply(model: type[BaseModel], content: str) -> tuple[dict[str, Claim], list[str]]:
    """Validate the model's JSON with the schema. A field whose value breaks the schema
    (an enum value the scenario does not have) is dropped and named; the others stay."""
    try:
        data = json.loads(content)
    except json.JSONDecodeError as exc:
        raise ProviderError(
            f"the model's reply is not valid JSON ({exc.msg} at {exc.pos})", retryable=True
        ) from exc
    if not isinstance(data, dict):
        raise ProviderError("the model's reply is not a JSON object", retryable=True)
    dropped: list[str] = []
    while True:
        try:
            parsed = model.model_validate(data)
            break
        except ValidationError as exc:
            bad = {str(error["loc"][0]) for error in exc.errors() if error["loc"]}
            if not bad or not bad.issubset(data):
                raise ProviderError(f"the reply breaks the schema: {exc}", retryable=True) from exc
            dropped += sorted(bad)
            data = {k: v for k, v in data.items() if k not in bad}
    claims: dict[str, Claim] = {}
    for name in model.model_fields:
        item = getattr(parsed, name)
        if item is not None:
            claims[name] = Claim(item.value, item.quote)
    return claims, dropped
