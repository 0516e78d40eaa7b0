"""Fitness tests of the code's shape, read from the source (no import runs): the import
graph of the project's packages, with every import counted wherever it sits (inside a
function, under TYPE_CHECKING), since an import moved into a function only hides a
cycle. ARCHITECTURE.md: no cycle between modules; the `aero` kernel imports no app;
`replay` -> `approvals` -> `diagnosis` -> `scenarios_admin` -> `aero`, no app importing
one to its left."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_PACKAGES = {"tests"}
# An arrow means "may import"; no app imports one to its left.
DIRECTION = ("replay", "approvals", "diagnosis", "scenarios_admin", "tools", "aero")

Graph = dict[str, set[str]]


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project's packages (top-level directories with an __init__),
    by dotted name; a package by its own name."""
    modules: dict[str, Path] = {}
    for package in sorted(root.iterdir()):
        if package.name in NOT_PACKAGES or not (package / "__init__.py").is_file():
            continue
        for path in package.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path) -> set[str]:
    """The dotted names `module` imports, anywhere in its body; `from x import y` as x.y
    (a submodule, or a name of x: resolved against the modules later)."""
    names: set[str] = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module a dotted name is in (its longest prefix that is one)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def import_graph(root: Path = ROOT) -> Graph:
    modules = project_modules(root)
    graph: Graph = defaultdict(set)
    for module, path in modules.items():
        for name in imported_names(module, path):
            target = resolve(name, modules)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's
    algorithm, iterative), as the path that closes it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    nodes = sorted(set(graph) | {t for targets in graph.values() for t in targets})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return [closing_path(graph, component) for component in components]


def closing_path(graph: Graph, component: set[str]) -> list[str]:
    """The shortest path from the component's first module back to itself."""
    first = min(component)
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph.get(node, ())):
                if target == first:
                    return [*paths[node], first]
                if target in component and target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {first}")  # a component always has one


def app_of(module: str) -> str:
    return module.split(".", 1)[0]


def test_no_import_cycle_between_modules() -> None:
    graph = import_graph()
    # The scan sees the imports inside functions, so the test can fail.
    assert "diagnosis.agent.state" in graph["diagnosis.agent.recording"]
    assert "diagnosis.models" in graph["diagnosis.agent.waits"]  # inside a function
    assert [" -> ".join(path) for path in cycles(graph)] == []


def test_the_kernel_imports_no_app() -> None:
    """`aero` is the kernel every app builds on: an app adds to it (sockets, health
    probes, start hooks, metrics) from its AppConfig.ready(), never the other way."""
    graph = import_graph()
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if app_of(module) == "aero"
        for target in targets
        if app_of(target) != "aero"
    )
    assert offenders == []


def test_apps_import_only_to_their_right() -> None:
    graph = import_graph()
    assert "scenarios_admin.models" in graph["diagnosis.models"]  # the scan reads the apps
    rank = {app: position for position, app in enumerate(DIRECTION)}
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if app_of(module) in rank
        for target in targets
        if app_of(target) in rank and rank[app_of(target)] < rank[app_of(module)]
    )
    assert offenders == []


def test_no_import_cycle_between_apps() -> None:
    """Between packages too (api and ingest each imported the other)."""
    apps: Graph = defaultdict(set)
    for module, targets in import_graph().items():
        apps[app_of(module)].update(app_of(t) for t in targets if app_of(t) != app_of(module))
    assert "aero" in apps["diagnosis"]
    assert [" -> ".join(path) for path in cycles(apps)] == []


def test_the_scan_finds_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from app import b\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import app.a\n")
    (package / "d.py").write_text("from app.a import thing\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["app.a", "app.b", "app.c", "app.a"]]
