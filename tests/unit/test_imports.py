"""The package's import graph, read from the source (nothing is imported): no cycle among
flowtide's modules at module level, and imports point inward only (DESIGN.md, "Layers"):
the engine and the playbook DSL import no runtime, server or worker module, the store no
server module, the server and the worker meet only in `flowtide.wire`, the read side
(`documents`, `web`) sits below the runtimes and the UI never imports the server
(docs/architecture.md).

Module level means what runs when a module is imported: imports inside functions (the
lazy imports of heavy dependencies) and under `if TYPE_CHECKING:` are not part of a
cycle. The layer rules count every import, lazy or not.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import flowtide

ROOT = Path(flowtide.__file__).resolve().parent
PACKAGE = "flowtide"

#: Every front door and runtime: what the read side sits below.
_ABOVE_THE_READ_SIDE = (
    "flowtide.runtime",
    "flowtide.server",
    "flowtide.worker",
    "flowtide.ui",
    "flowtide.cli",
    "flowtide.client",
    "flowtide.dev",
    "flowtide.embedded",
)

#: module prefix -> the prefixes it must never import.
LAYERS: dict[str, tuple[str, ...]] = {
    "flowtide.engine": (
        "flowtide.runtime",
        "flowtide.server",
        "flowtide.worker",
        "flowtide.cli",
        "flowtide.client",
    ),
    "flowtide.playbook": (
        "flowtide.runtime",
        "flowtide.server",
        "flowtide.worker",
        "flowtide.cli",
        "flowtide.client",
    ),
    "flowtide.store": (
        "flowtide.server",
        "flowtide.worker",
        "flowtide.cli",
        "flowtide.documents",
        "flowtide.web",
        "flowtide.ui",
    ),
    # Runs that start themselves: below the apps that run the scheduler.
    "flowtide.triggers": (
        "flowtide.server",
        "flowtide.worker",
        "flowtide.cli",
        "flowtide.web",
        "flowtide.ui",
        "flowtide.runtime",
        "flowtide.documents",
    ),
    # The read models: below every app that shows them, and no HTTP in them.
    "flowtide.documents": (*_ABOVE_THE_READ_SIDE, "flowtide.web", "flowtide.tools"),
    # The HTTP edge both apps mount: it knows neither.
    "flowtide.web": _ABOVE_THE_READ_SIDE,
    # `flowtide ui` is wired from the read side and the embedded runtime, never from
    # the server's modules (which import only its page: see below).
    "flowtide.ui": ("flowtide.server", "flowtide.worker", "flowtide.cli"),
    # The server and the worker meet only in the wire contract, which imports neither.
    "flowtide.wire": ("flowtide.server", "flowtide.worker", "flowtide.runtime", "flowtide.cli"),
    "flowtide.worker": ("flowtide.server", "flowtide.cli"),
    # Notifications: below the runtimes that owe and relay them, beside the read side.
    "flowtide.notify": (*_ABOVE_THE_READ_SIDE, "flowtide.web", "flowtide.documents"),
    "flowtide.server": ("flowtide.worker", "flowtide.cli", "flowtide.runtime.local"),
    # What runs commands is shared by both sides and knows neither.
    "flowtide.runtime": (
        "flowtide.server",
        "flowtide.worker",
        "flowtide.cli",
        "flowtide.web",
        "flowtide.ui",
    ),
}

#: What the read models may import: the engine, the playbook, the store port (not an
#: adapter), ids, errors, redaction and JSON values.
DOCUMENTS_MAY_IMPORT = (
    "flowtide.documents",
    "flowtide.engine",
    "flowtide.playbook",
    "flowtide.store.base",
    "flowtide.ids",
    "flowtide.errors",
    "flowtide.redaction",
    "flowtide.jsonvalues",
    # schedules: when they fire and how they are written (pure), the trigger rows
    "flowtide.triggers.when",
    "flowtide.triggers.spec",
    "flowtide.triggers.subscription",
    "flowtide.store.triggers",
)


@dataclass(frozen=True)
class Import:
    target: str
    line: int
    #: Runs when the importing module is imported (not in a function, not type-only).
    module_level: bool
    #: Under `if TYPE_CHECKING:`: never runs.
    type_only: bool = False


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    # A package's own `from . import x` is relative to the package itself.
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str) -> Iterator[Import]:
    """Every import of a flowtide module by `module`, with where it runs."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, module_level: bool, type_only: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, node.lineno, module_level, type_only)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                target = submodule if submodule in MODULES else source
                yield Import(target, node.lineno, module_level, type_only)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, False, True)
            for child in node.orelse:
                yield from visit(child, module_level, type_only)
            return
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            module_level = False
        for child in ast.iter_child_nodes(node):
            yield from visit(child, module_level, type_only)

    for found in visit(tree, True, False):
        if found.target == PACKAGE or found.target.startswith(PACKAGE + "."):
            yield found


def _graph(*, late: bool = False, within: tuple[str, ...] = (PACKAGE,)) -> dict[str, set[str]]:
    """module -> the modules it imports at module level (`late`: in functions too), of
    the modules under the prefixes `within`."""

    def inside(name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in within)

    graph: dict[str, set[str]] = {m: set() for m in MODULES if inside(m)}
    for module in graph:
        for found in imports_of(module):
            if found.type_only or not (found.module_level or late):
                continue
            if found.target in graph and found.target != module:
                graph[module].add(found.target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def _path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through the component's first module, for the message."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                cycle = [v]
                while cycle[-1] != start:
                    cycle.append(parents[cycle[-1]])
                return [start, *reversed(cycle[:-1]), start]
            if w not in parents:
                parents[w] = v
                todo.append(w)
    return component


def test_the_walk_sees_the_package() -> None:
    assert "flowtide.server.app" in MODULES
    assert "flowtide.store.pg" in MODULES
    graph = _graph()
    assert "flowtide.server.coordinator" in graph["flowtide.server.runtime"]
    # Lazy imports are not module level: the app's store adapter is loaded on start.
    lazy = {i.target for i in imports_of("flowtide.server.runtime") if not i.module_level}
    assert "flowtide.store.postgres" in lazy


def test_no_import_cycle_at_module_level() -> None:
    graph = _graph()
    cycles = [" -> ".join(_path(graph, c)) for c in _cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_import_cycle_in_the_server_even_through_late_imports() -> None:
    # A late import (inside a function) can hide a cycle from the interpreter, not from
    # the reader: the runtimes' modules must form layers, late imports included.
    graph = _graph(late=True, within=("flowtide.server", "flowtide.store"))
    cycles = [" -> ".join(_path(graph, c)) for c in _cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _path(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_imports_point_inward(layer: str) -> None:
    banned = LAYERS[layer]
    found = [
        f"{MODULES[m].relative_to(ROOT.parent)}:{i.line} imports {i.target}"
        for m in MODULES
        if m == layer or m.startswith(layer + ".")
        for i in imports_of(m)
        if any(i.target == b or i.target.startswith(b + ".") for b in banned)
    ]
    assert not found, "upward imports:\n" + "\n".join(found)


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_read_models_import_only_the_core() -> None:
    found = [
        f"{MODULES[m].relative_to(ROOT.parent)}:{i.line} imports {i.target}"
        for m in MODULES
        if _within(m, ("flowtide.documents",))
        for i in imports_of(m)
        if not _within(i.target, DOCUMENTS_MAY_IMPORT)
    ]
    assert not found, "flowtide.documents imports beyond the core:\n" + "\n".join(found)


#: What the settings tree may import: itself and the error tree (and, outside flowtide,
#: only the standard library, pydantic and pydantic-settings).
SETTINGS_MAY_IMPORT = ("flowtide.settings", "flowtide.errors")
SETTINGS_MAY_IMPORT_OUTSIDE = ("pydantic", "pydantic_settings")


def test_the_settings_import_only_errors_and_pydantic() -> None:
    found = [
        f"{MODULES[m].relative_to(ROOT.parent)}:{i.line} imports {i.target}"
        for m in MODULES
        if _within(m, ("flowtide.settings",))
        for i in imports_of(m)
        if not _within(i.target, SETTINGS_MAY_IMPORT)
    ]
    for module in MODULES:
        if not _within(module, ("flowtide.settings",)):
            continue
        for node in ast.walk(ast.parse(MODULES[module].read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in (
                    PACKAGE,
                    *SETTINGS_MAY_IMPORT_OUTSIDE,
                ):
                    found.append(f"{MODULES[module].relative_to(ROOT.parent)} imports {name}")
    assert not found, "flowtide.settings imports beyond errors and pydantic:\n" + "\n".join(found)


def test_the_server_imports_of_the_ui_only_its_page() -> None:
    # The server mounts the page; what the page reads is flowtide.documents and
    # flowtide.web, below both apps.
    found = [
        f"{MODULES[m].relative_to(ROOT.parent)}:{i.line} imports {i.target}"
        for m in MODULES
        if _within(m, ("flowtide.server",))
        for i in imports_of(m)
        if _within(i.target, ("flowtide.ui",))
        and i.target not in ("flowtide.ui", "flowtide.ui.pages")
    ]
    assert not found, "the server imports the UI beyond its page:\n" + "\n".join(found)


def test_no_import_cycle_at_all_even_through_late_imports() -> None:
    # Late imports (inside functions) keep heavy dependencies off start-up; they must
    # not hide a cycle between two modules either (the one that was between `errors`
    # and `kv.errors` was hidden so).
    graph = _graph(late=True)
    cycles = [" -> ".join(_path(graph, c)) for c in _cycles(graph)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_playbook_knows_tool_kinds_not_their_runners() -> None:
    # The loader asks which kinds exist and what their fields are; a runner's module (and
    # duckdb, psycopg, pyspark behind it) is the runtime's to import.
    allowed = {"flowtide.tools", "flowtide.tools.kinds", "flowtide.tools.spec"}
    found = [
        f"{MODULES[m].relative_to(ROOT.parent)}:{i.line} imports {i.target}"
        for m in MODULES
        if m.startswith("flowtide.playbook")
        for i in imports_of(m)
        if i.target.startswith("flowtide.tools") and i.target not in allowed
    ]
    assert not found, "the playbook imports a tool's runner:\n" + "\n".join(found)
    # ...and what it may import imports no runner either.
    for module in ("flowtide.tools.kinds", "flowtide.tools.spec", "flowtide.tools.builtin"):
        tools = {i.target for i in imports_of(module) if i.target.startswith("flowtide.tools")}
        assert tools <= {*allowed, "flowtide.tools.builtin"}, module


#: The pure side of triggers (when a schedule fires, the schedule as written, what a
#: scheduler does now): each other, the error tree and the text check (`storable`, pure);
#: outside flowtide the standard library and croniter, which only functions import (it
#: stays off `flowtide --help`).
TRIGGERS_PURE = (
    "flowtide.triggers.when",
    "flowtide.triggers.spec",
    "flowtide.triggers.plan",
    "flowtide.triggers.subscription",
)
TRIGGERS_MAY_IMPORT = (*TRIGGERS_PURE, "flowtide.errors", "flowtide.storable")
TRIGGERS_MAY_IMPORT_OUTSIDE = ("croniter",)


def test_the_pure_triggers_import_only_errors_and_croniter() -> None:
    found = [
        f"{MODULES[m].relative_to(ROOT.parent)}:{i.line} imports {i.target}"
        for m in TRIGGERS_PURE
        if m in MODULES
        for i in imports_of(m)
        if i.target not in TRIGGERS_MAY_IMPORT
    ]
    for module in TRIGGERS_PURE:
        if module not in MODULES:
            continue
        tree = ast.parse(MODULES[module].read_text())
        at_module_level = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            where = f"{MODULES[module].relative_to(ROOT.parent)}:{node.lineno}"
            for name in names:
                top = name.split(".")[0]
                if top in TRIGGERS_MAY_IMPORT_OUTSIDE and id(node) in at_module_level:
                    found.append(f"{where} imports {name} at module level")
                elif top not in sys.stdlib_module_names and top not in (
                    PACKAGE,
                    *TRIGGERS_MAY_IMPORT_OUTSIDE,
                ):
                    found.append(f"{where} imports {name}")
    assert not found, "flowtide.triggers imports beyond its own:\n" + "\n".join(found)
