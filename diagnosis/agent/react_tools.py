"""The tools the model may pick in a ReAct step: the packs' lookups, their agents' own
analyses and the packs' actions, each with the OpenAI schema of its pydantic argument
model (generated once per process)."""

from __future__ import annotations

import functools
import json
from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel

from aero.packs import action_tool, installed_packs


def tool_args() -> dict[str, tuple[type[BaseModel], str]]:
    """Every tool the model may pick, with its argument model and description: the
    packs' lookups, the analyses, the packs' actions, in that order."""
    packs = installed_packs()
    found: dict[str, tuple[type[BaseModel], str]] = {
        name: (lookup.schema, lookup.description)
        for pack in packs
        for name, lookup in pack.tools.lookups.items()
        if lookup.schema is not None
    }
    for pack in packs:
        found.update(pack.tools.analyses)
    for pack in packs:
        for name, action in pack.tools.actions.items():
            if action.schema is not None:
                found.setdefault(name, (action.schema, action.description))
    return found


def tool_schemas(definition: dict[str, Any]) -> list[dict[str, Any]]:
    """The OpenAI tool list for a scenario: the lookups, risk, impact, and the action tools
    the scenario uses, each with the JSON schema of its pydantic argument model."""
    used = {action["tool"] for action in definition.get("actions", [])}
    # Copies: a caller may add to a schema; the cached one stays as generated.
    return [
        json.loads(_tool_schema(name))
        for name in tool_args()
        if name in used or action_tool(name) is None
    ]


@functools.cache
def _tool_schema(name: str) -> str:
    """One tool's schema, generated once per process (as JSON): pydantic's schema
    generation is costly, and every model call of every resumed step would pay it for
    the same dozen fixed models."""
    model, description = tool_args()[name]
    schema = convert_to_openai_tool(model)
    schema["function"]["name"] = name
    schema["function"]["description"] = description
    return json.dumps(schema)
