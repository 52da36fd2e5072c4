"""No import cycles anywhere in the house (docs/development.md, "Layers").

The graph has one node per module of every package (the five distributions and the benchmarks) and an
edge for every import of another house module: at module level, inside functions and under
TYPE_CHECKING alike, since a type-only cycle still ties the two modules into one. `from pkg import
name` points at `pkg.name` where that is a module, else at `pkg` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "trtforge": REPO / "trtforge",
    "trtforge_operator": REPO / "operator" / "trtforge_operator",
    "trtforge_builder": REPO / "builder_job" / "trtforge_builder",
    "trtforge_runtime": REPO / "runtime_image" / "trtforge_runtime",
    "trtforge_dev": REPO / "dev" / "trtforge_dev",
    "benchmarks": REPO / "benchmarks",
}


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Dotted name -> file, for every module of the packages (a package is its __init__.py)."""
    out: dict[str, Path] = {}
    for top, root in packages.items():
        for path in root.rglob("*.py"):
            parts = [top, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, known: set[str]) -> set[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = here.split(".") if is_package else here.split(".")[:-1]
            up = package[: len(package) - node.level + 1]
            base = ".".join([*up, base] if base else up)
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = set()
    for name in names:
        while name and name not in known:  # `import a.b.c` of a non-module attribute: its module
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    mods = modules(packages)
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges |= _targets(node, name, is_package, known)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the house's module count
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
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_one_cycle(graph, comp) for comp in components)


def _one_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, as [a, b, ..., a]."""
    start = min(comp)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & comp):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                todo.append(w)
    raise AssertionError(f"no cycle in {comp}")


def test_the_house_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGES)
    assert len(graph) > 150, "too few modules found: the walk would prove nothing"
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_walk_finds_a_type_only_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n"
    )
    (pkg / "c.py").write_text("def f():\n    from . import a\n")
    (pkg / "d.py").write_text("from pkg import a\nimport pkg.sub.b\n")  # into the cycle, not part of it
    graph = import_graph({"pkg": pkg})
    assert graph["pkg.d"] == {"pkg.a", "pkg.sub.b"}
    assert cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]


@pytest.mark.parametrize("top", sorted(PACKAGES))
def test_every_package_is_walked(top: str) -> None:
    assert any(name == top or name.startswith(top + ".") for name in import_graph({top: PACKAGES[top]}))


@pytest.mark.parametrize("top", ["benchmarks", "trtforge_dev"])
def test_benchmarks_and_dev_import_nothing_from_tests(top: str) -> None:
    """The test suite sits on top: what benchmarks and the dev tools share with it lives in trtforge_dev."""
    found = []
    for path in sorted(PACKAGES[top].rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [
                f"{path.relative_to(REPO)}:{node.lineno} imports {n}"
                for n in names
                if n.split(".")[0] == "tests"
            ]
        if "sys.path" in path.read_text() and '"tests"' in path.read_text():
            found.append(f"{path.relative_to(REPO)}: puts tests/ on sys.path")
    assert found == []
