"""Scenario definitions as YAML files: one file per scenario, in a canonical form.

A definition stored in PostgreSQL (jsonb) keeps no key order, so the order of every
mapping in the file is defined, never taken from the stored document: the core's keys in
the order below (or the order the kind's definition model lists, its own keys among them:
`key_order`), fields in `field_order`, enum values alphabetically (bool: true, false); the
pack orders its own parts (DomainPack.canonical_parts), else its model's field order does.
The same definition therefore always gives the same bytes, and
`dump(load(dump(d))) == dump(d)`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel

from aero.packs import DomainPack, UnknownDomain, pack_for
from scenarios_admin.definition import LANGUAGES, TOP_KEYS, VALUE_KEYS, Issue, value_order

FIELD_KEY_ORDER = ("label", "type", "kinds", "priority", "ask", "default", "values", "measure")
BAND_KEY_ORDER = ("above", "at_least", "value")


@dataclass(frozen=True)
class LocatedIssue:
    """A problem of a YAML file: its line (when known), its path and what is wrong."""

    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.path}: {self.message}"


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Indent list items under their key (the default puts "- " at the key's column).
        super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # Multi-line text (templates, prompts) as a literal block; PyYAML falls back to a
    # quoted scalar where a block cannot hold the text exactly.
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


def _flow(items: list[Any]) -> bool:
    """Short collections of plain values on one line ({zh: 燃油, en: Fuel}, a condition
    such as {phase: [TAKEOFF_ROLL, CLIMB], debris: true}); everything else as blocks."""
    length = 0
    for item in items:
        if isinstance(item, dict):
            return False
        parts = item if isinstance(item, list) else [item]
        for part in parts:
            if isinstance(part, dict | list) or (isinstance(part, str) and "\n" in part):
                return False
            length += len(str(part)) + 2
    return length <= 72


def _represent_dict(dumper: yaml.SafeDumper, data: dict[Any, Any]) -> yaml.MappingNode:
    flow = _flow([*data.keys(), *data.values()]) or not data
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=flow)


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.SequenceNode:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=_flow(data))


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(dict, _represent_dict)
_Dumper.add_representer(list, _represent_list)


def dump_definition(definition: dict[str, Any]) -> str:
    return yaml.dump(
        canonical(definition),
        Dumper=_Dumper,
        allow_unicode=True,
        sort_keys=False,
        width=100,
    )


def canonical(definition: dict[str, Any]) -> dict[str, Any]:
    """A copy of a valid definition with every mapping in canonical key order."""
    pack = _pack(definition.get("kind"))
    model = pack.definition_model if pack is not None else None
    own = pack.canonical_parts(definition) if pack and pack.canonical_parts else {}
    model_fields = getattr(model, "model_fields", {})
    # The kind's order (its own keys among the core's), else the core's; keys in neither
    # follow in the document's order, each in its model's field order.
    order = getattr(model, "key_order", ()) or TOP_KEYS
    out: dict[str, Any] = {}
    for key in order:
        if key not in definition:
            continue
        value = definition[key]
        if key in ("name", "report_template"):
            value = ordered(value, LANGUAGES)
        elif key == "fields":
            value = {name: _field(value[name]) for name in definition["field_order"]}
        elif key in own:
            value = own[key]
        out[key] = value
    for key, value in definition.items():
        if key not in out:
            known = model_fields.get(key)
            out[key] = own.get(key, _by_model(value, known.annotation) if known else value)
    return out


def _pack(kind: Any) -> DomainPack | None:
    try:
        return pack_for(str(kind))
    except UnknownDomain:
        return None


def _by_model(value: Any, annotation: Any) -> Any:
    """`value` with the keys of every mapping a pydantic model reads in the model's field
    order (keys it does not know after them), through lists, dicts and optionals: jsonb
    keeps no order, so the model's is the one the file shows."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not isinstance(value, dict):
            return value
        fields = annotation.model_fields
        in_order = ordered(value, tuple(fields))
        return {
            k: (_by_model(v, fields[k].annotation) if k in fields else v)
            for k, v in in_order.items()
        }
    args = [a for a in get_args(annotation) if a is not type(None)]
    origin = get_origin(annotation)
    if origin in (list, tuple) and isinstance(value, list) and args:
        return [_by_model(item, args[0]) for item in value]
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        # Keys from a Literal (texts by language) in the Literal's order.
        keys = get_args(args[0]) if get_origin(args[0]) is Literal else ()
        return {k: _by_model(v, args[1]) for k, v in ordered(value, keys).items()}
    if len(args) == 1:  # Optional[X] and Annotated-free unions of one model
        return _by_model(value, args[0])
    return value


def ordered(mapping: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """`mapping` with `keys` first, in their order, then the rest as they were."""
    known = {k: mapping[k] for k in keys if k in mapping}
    return known | {k: v for k, v in mapping.items() if k not in known}


def _field(spec: dict[str, Any]) -> dict[str, Any]:
    out = ordered(spec, FIELD_KEY_ORDER)
    for key in ("label", "ask"):
        if key in out:
            out[key] = ordered(out[key], LANGUAGES)
    if "values" in out:
        out["values"] = {value: _value(out["values"][value]) for value in value_order(spec)}
    if "measure" in out:
        measure = ordered(out["measure"], ("units", "bands"))
        measure["bands"] = [ordered(band, BAND_KEY_ORDER) for band in measure.get("bands", [])]
        out["measure"] = measure
    return out


def _value(spec: dict[str, Any]) -> dict[str, Any]:
    out = ordered(spec, VALUE_KEYS)
    if "label" in out:
        out["label"] = ordered(out["label"], LANGUAGES)
    return out


# --- reading --------------------------------------------------------------------------

# A scenario file is about 10 KB; anything far larger is a mistake or an attack.
MAX_FILE_CHARS = 512 * 1024


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases. A scenario never needs them, and a few
    hundred bytes of nested aliases ("billion laughs") expand to gigabytes when loaded or
    walked; refusing them at the first one bounds the work by the file's size."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            kind = "aliases" if isinstance(event, yaml.AliasEvent) else "anchors"
            raise yaml.composer.ComposerError(
                None,
                None,
                f"YAML {kind} (&name, *name) are not allowed in scenario files; "
                "write the values out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def load_yaml(text: str) -> tuple[Any, list[LocatedIssue]]:
    """The document and, if it cannot be read, why (with the line). Anchors and aliases
    are refused, and so are files over MAX_FILE_CHARS and nesting deeper than Python's
    recursion limit (PyYAML composes recursively)."""
    if len(text) > MAX_FILE_CHARS:
        return None, [
            LocatedIssue(
                None,
                "(file)",
                f"the file is too large ({len(text):,} characters, at most {MAX_FILE_CHARS:,})",
            )
        ]
    if "\x00" in text:
        nul_line = text.count("\n", 0, text.index("\x00")) + 1
        return None, [LocatedIssue(nul_line, "(file)", "the file contains a NUL character")]
    try:
        return yaml.load(text, Loader=_NoAliasLoader), []
    except RecursionError:
        return None, [LocatedIssue(None, "(file)", "not valid YAML: nested too deeply")]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        column = f", column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "cannot be read"
        return None, [LocatedIssue(line, "(file)", f"not valid YAML{column}: {problem}")]
    except yaml.YAMLError as exc:
        return None, [LocatedIssue(None, "(file)", f"not valid YAML: {exc}")]


def line_index(text: str) -> dict[str, int]:
    """Path ("risk_rules[3].when.fluid") -> line number, for every key and list item."""
    lines: dict[str, int] = {}
    try:
        # Never walk an alias: the same loader as load_yaml (a shared node would be walked
        # once per reference, which is how a small file took 26 s and 1.3 GB).
        root = yaml.compose(text, Loader=_NoAliasLoader)
    except (yaml.YAMLError, RecursionError):
        return lines

    def walk(node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = str(key_node.value)
                child = f"{path}.{key}" if path else key
                lines[child] = key_node.start_mark.line + 1
                walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                child = f"{path}[{i}]"
                lines[child] = item.start_mark.line + 1
                walk(item, child)

    if root is not None:
        walk(root, "")
    return lines


_LAST_PART = re.compile(r"(\.[^.\[\]]+|\[\d+\])$")


def locate(issues: list[Issue], text: str) -> list[LocatedIssue]:
    """Each issue with the line of its path (or of the nearest enclosing part) in `text`."""
    lines = line_index(text)
    located = []
    for issue in issues:
        path = issue.path
        while path and path not in lines:
            shorter = _LAST_PART.sub("", path)
            path = "" if shorter == path else shorter
        located.append(LocatedIssue(lines.get(path), issue.path, issue.message))
    return located
