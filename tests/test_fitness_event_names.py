"""Fitness test: an event type is named in one place. Code outside the declarations names
a type through its constant (diagnosis.eventlog.names, or the pack module that declares
it), never as a bare string: a typo in a bare string filters or writes nothing and no
test notices, while a typo in a constant's name fails at import.

Read from the source with `ast`: a string literal in code equal to a registered type's
name fails, unless it is the value of a module-level UPPER_CASE constant (the one
declaration of that name). Comments and docstrings never match a whole type name.
"""

from __future__ import annotations

import ast
from pathlib import Path

from diagnosis.eventlog import registry

ROOT = Path(__file__).resolve().parent.parent
# Not the `aero` kernel: it imports no app, and the names it holds are audit actions
# (aero.audit_words), another record whose names some events share.
CODE = (
    "diagnosis",
    "approvals",
    "replay",
    "scenarios_admin",
    "api",
    "ingest",
    "tools",
    "packs",
)


def _declared_constants(tree: ast.Module) -> set[int]:
    """Ids of the string nodes that are a module-level constant's value."""
    ids: set[int] = set()
    for node in tree.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        if (
            isinstance(value, ast.Constant)
            and targets
            and all(isinstance(t, ast.Name) and t.id.isupper() for t in targets)
        ):
            ids.add(id(value))
    return ids


def bare_names() -> list[str]:
    names = set(registry.registered())
    found: list[str] = []
    for package in CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            allowed = _declared_constants(tree)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value in names
                    and id(node) not in allowed
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    return found


def test_the_registry_is_filled() -> None:
    # Guards the test below: with nothing registered it would pass on anything.
    assert {"session.created", "approval.required", "finding.recorded"} <= set(
        registry.registered()
    )


def test_no_event_type_is_a_bare_string_outside_its_declaration() -> None:
    found = bare_names()
    assert not found, "name these by their constant:\n" + "\n".join(found)
