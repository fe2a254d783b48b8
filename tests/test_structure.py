"""The package's structure: imports inside ``rankmesh`` go one way, along the data path
config → layout (Rust) → this rank's groups → process groups → DeviceMesh objects → convention.

Read from the source of the package under test (the installed wheel in CI), by ``ast``: every
``import`` of a ``rankmesh`` module counts, at module level or inside a function (a lazy import
is still a dependency), except under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import rankmesh

PACKAGE = Path(rankmesh.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


class _Imports(ast.NodeVisitor):
    def __init__(self, modules: dict[str, Path]) -> None:
        self.modules = modules
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or not node.module.startswith("rankmesh"):
            return
        submodules = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in self.modules]
        self.found.update(submodules)
        if len(submodules) < len(node.names):  # a name defined in the module itself
            self.found.add(node.module)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(a.name for a in node.names if a.name.startswith("rankmesh"))


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        visitor = _Imports(modules)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        graph[name] = {m for m in visitor.found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_rankmesh():
    graph = import_graph()
    assert "rankmesh.process_groups" in graph and "rankmesh.mesh" in graph
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(
        " <-> ".join(f"{m} (imports {sorted(graph[m] & set(c))})" for m in c) for c in found
    )


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_process_groups_sit_below_the_meshes():
    """The process-group layer (and the consistency check on it) knows nothing of DeviceMesh: it
    imports no mesh module and its code names no ``DeviceMesh`` (its docs may)."""
    graph = import_graph()
    for low in ("rankmesh.process_groups", "rankmesh.consistency", "rankmesh._fast_groups", "rankmesh._groups"):
        assert not {m for m in graph[low] if m.startswith("rankmesh.mesh")}, low
        tree = ast.parse((PACKAGE / (low.split(".")[1] + ".py")).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name.split(".")[-1] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not {n for n in names if "DeviceMesh" in n}, low
