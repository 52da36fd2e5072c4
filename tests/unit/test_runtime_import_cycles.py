"""No import cycles inside the runtime: the lifecycle (server) calls the service and the front ends,
the front ends call the service, the start-up's steps hand their results forward (warmstart), and no
module imports back up. Every import counts, those inside functions and TYPE_CHECKING blocks too: a
lazy import that closes a cycle is still a cycle in the design."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "runtime_image"
PACKAGE = "trtforge_runtime"


def _modules() -> dict[str, Path]:
    out = {}
    for path in (ROOT / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the runtime that `module` imports by name."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")
                parent = parent[: len(parent) - node.level + (1 if is_package else 0)]
                base = ".".join([*parent, base] if base else parent)
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        found.update(n for n in names if n in known and n != module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: _imports(m, p, known) for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    graph = import_graph()
    assert (
        "trtforge_runtime.protocol.grpc_service" in graph["trtforge_runtime.lifecycle.runtime"]
    )  # inside a method
    assert (
        "trtforge_runtime.lifecycle.fetch" in graph["trtforge_runtime.lifecycle.warmstart"]
    )  # TYPE_CHECKING and lazy
    assert "trtforge_runtime.serving.service" in graph["trtforge_runtime.protocol.grpc_calls"]


def test_the_runtime_has_no_import_cycles() -> None:
    assert cycles(import_graph()) == []
