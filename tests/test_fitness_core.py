"""Fitness test: the core knows no domain. A core module (aero, diagnosis, approvals,
replay, scenarios_admin, api, ingest, tools; migrations aside: they replay history) imports no
pack, and names no airport thing, read from the source without importing it.

How "names" is read: with `ast`, so comments and docstrings do not count (they may say
why, with an example from a domain) while every identifier does (a name, an attribute,
a function, class, argument or keyword name, an imported name) and so does every string
in code (a dict key, a tool name, a user-visible text: the domain's words belong to its
pack). An identifier is split into words at underscores and capitals
(`stand_mismatch`, `AirportGraph`), so "standard" or "understand" never match.

The core's templates (`templates/`: pages, partials, the Markdown export, the admin's) are
read the same way, as text: every word outside a template comment counts (markup, test
ids, variables, the msgids the .po translates), so an airport line drawn by a core
template fails as the code naming it would; a pack's part is drawn by the pack's own
template, reached through a hook (`DomainPack.card_template` ...).

ALLOWED_TODAY lists the modules and templates that still name airport things, with how
many times. The move of the airport into `packs/airport` is done (tracker issue 28): the
list is empty and stays so. A file not listed, or one naming more than its count, fails;
so does a listed file that names none any more."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ("aero", "diagnosis", "approvals", "replay", "scenarios_admin", "api", "ingest", "tools")
AIRPORT_WORDS = frozenset(
    {"flight", "stand", "taxiway", "runway", "closure", "airport"}
    | {"flights", "stands", "taxiways", "runways", "closures", "airports"}
)
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")
# A template's comments, as the template engine skips them: {# ... #} and {% comment %}.
_TEMPLATE_COMMENT = re.compile(r"\{#.*?#\}|\{%\s*comment\b.*?%\}.*?\{%\s*endcomment\s*%\}", re.S)

# Module or template (path from the project root) -> how many airport words it still has,
# at most. It stays empty: the core names no airport thing.
ALLOWED_TODAY: dict[str, int] = {}


def core_modules(root: Path = ROOT) -> list[Path]:
    return sorted(
        path
        for package in CORE
        for path in (root / package).rglob("*.py")
        if "migrations" not in path.relative_to(root).parts
    )


def core_templates(root: Path = ROOT) -> list[Path]:
    """Every file of the core's templates (HTML, the Markdown export, text)."""
    return sorted(path for path in (root / "templates").rglob("*") if path.is_file())


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings or bare string statements."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for statement in body:
            if (
                isinstance(statement, ast.Expr)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                found.add(id(statement.value))
    return found


def _names(tree: ast.AST) -> list[str]:
    """Every identifier and every string in code of a module."""
    docstrings = _docstrings(tree)
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.arg | ast.keyword) and node.arg:
            names.append(node.arg)
        elif isinstance(node, ast.alias):
            names.append(node.asname or node.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            names.append(node.value)
    return names


def airport_words(source: str) -> Counter[str]:
    """The airport words a module's code names, counted."""
    found: Counter[str] = Counter()
    for name in _names(ast.parse(source)):
        for word in _WORD.findall(name):
            if word.lower() in AIRPORT_WORDS:
                found[word.lower()] += 1
    return found


def template_airport_words(source: str) -> Counter[str]:
    """The airport words a template names outside its comments, counted."""
    found: Counter[str] = Counter()
    for word in _WORD.findall(_TEMPLATE_COMMENT.sub(" ", source)):
        if word.lower() in AIRPORT_WORDS:
            found[word.lower()] += 1
    return found


def pack_imports(source: str) -> list[str]:
    """The packs a module imports, anywhere in it (inside a function too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "packs"]
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == "packs"
        ):
            found.append(str(node.module))
    return found


def test_the_reader_counts_code_not_comments_or_docstrings() -> None:
    source = '''
"""A module about the airport."""
# a comment on a runway
def f(stand_no: str) -> str:
    """Close the taxiway."""
    understand = "standard"
    return AirportGraph(flight=stand_no, label="Close runway %(runway)s", x=understand)
'''
    assert airport_words(source) == Counter({"stand": 2, "airport": 1, "flight": 1, "runway": 2})
    assert pack_imports("import packs.airport\nfrom packs import x\nfrom aero.packs import y") == [
        "packs.airport",
        "packs",
    ]


def test_the_template_reader_counts_words_shown_not_comments() -> None:
    source = """{# a request in flight #}{% comment %}The runway's card.{% endcomment %}
<p data-testid="stand-mismatch">{% translate "Flights" %} {{ group.impact.taxiways|join:", " }}
{% blocktranslate %}the airport board shows the closure{% endblocktranslate %}, standard</p>"""
    assert template_airport_words(source) == Counter(
        {"stand": 1, "flights": 1, "taxiways": 1, "airport": 1, "closure": 1}
    )


def test_no_core_module_imports_a_pack() -> None:
    offenders = {
        str(path.relative_to(ROOT)): imports
        for path in core_modules()
        if (imports := pack_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, "the core reaches a pack through aero.packs, never by import"


def test_no_core_module_names_an_airport_thing_beyond_todays_list() -> None:
    counts = {
        str(path.relative_to(ROOT)): sum(airport_words(path.read_text(encoding="utf-8")).values())
        for path in core_modules()
    } | {
        str(path.relative_to(ROOT)): sum(
            template_airport_words(path.read_text(encoding="utf-8")).values()
        )
        for path in core_templates()
    }
    new = {path: n for path, n in counts.items() if n and path not in ALLOWED_TODAY}
    grown = {
        path: (ALLOWED_TODAY[path], n)
        for path, n in counts.items()
        if path in ALLOWED_TODAY and n > ALLOWED_TODAY[path]
    }
    clean = sorted(path for path in ALLOWED_TODAY if not counts.get(path))
    assert new == {}, "core modules or templates naming airport things: move them to packs/airport"
    assert grown == {}, "(allowed, now): these files name more airport things than before"
    assert clean == [], "these files name no airport thing any more: take them off the list"
