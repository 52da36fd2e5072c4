"""The planners are pure: no planning module takes a callable or reaches I/O (docs/design.md
§"Observe, plan, apply").

Read from the source (AST), not by importing: every function of `trtforge_operator.planning` (and
the views they take, `observe/views.py`) is checked for parameters or fields annotated as callables
(`Callable`, `Awaitable`, `Coroutine`) and for `async def`, and every module those reach inside the
operator package, directly or through other operator modules, for imports of `kube`, the store
(`store_reader`, `trtforge.store`), `kubernetes` or `kopf`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "operator" / "trtforge_operator"
PLANNING = sorted((PKG / "planning").glob("*.py"))
INPUTS = [PKG / "observe" / "views.py"]  # the planners' inputs: views only
CALLABLE_NAMES = ("Callable", "Awaitable", "Coroutine")
FORBIDDEN = (
    "kopf",
    "kubernetes",
    "trtforge.store",
    "trtforge_operator.kube",
    "trtforge_operator.store_reader",
)


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_path(name: str) -> Path | None:
    base = PKG.parent.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def imports(path: Path) -> set[str]:
    """Every module `path` imports (`from a import b` counts `a` and `a.b`), including its packages."""
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    parents = {".".join(m.split(".")[:i]) for m in out for i in range(1, m.count(".") + 1)}
    return out | parents


def forbidden(name: str) -> bool:
    return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)


def reached(start: Path) -> dict[str, list[str]]:
    """Operator modules `start` reaches through imports -> the path of imports that reaches each."""
    seen: dict[str, list[str]] = {module_name(start): [module_name(start)]}
    todo = [start]
    while todo:
        path = todo.pop()
        chain = seen[module_name(path)]
        for name in sorted(imports(path)):
            if name in seen:
                continue
            seen[name] = [*chain, name]
            if name.startswith("trtforge_operator") and not forbidden(name) and (p := module_path(name)):
                todo.append(p)
    return seen


def callable_annotations(source: str, filename: str) -> list[str]:
    """`function(param)` or `Class.field` whose annotation is a callable type; `async def`s."""
    tree = ast.parse(source, filename)
    out: list[str] = []
    names = set(CALLABLE_NAMES)
    for stmt in tree.body:  # module-level aliases: `Lookup = Callable[[str], int]`
        if isinstance(stmt, ast.Assign) and any(n in ast.unparse(stmt.value) for n in CALLABLE_NAMES):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))

    def is_callable(annotation: ast.expr | None) -> bool:
        if annotation is None:
            return False
        text = ast.unparse(annotation)
        return any(
            n.id in names
            for n in ast.walk(ast.parse(text.strip("'\""), mode="eval"))
            if isinstance(n, ast.Name)
        )

    for node in ast.walk(tree):
        if isinstance(node, ast.AsyncFunctionDef):
            out.append(f"async def {node.name}")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and is_callable(arg.annotation):
                    out.append(f"{node.name}({arg.arg})")
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and is_callable(stmt.annotation):
                    out.append(f"{node.name}.{ast.unparse(stmt.target)}")
    return out


@pytest.mark.parametrize("path", PLANNING + INPUTS, ids=lambda p: p.name)
def test_no_planner_takes_a_callable(path: Path) -> None:
    found = callable_annotations(path.read_text(), str(path))
    assert not found, f"{path.relative_to(ROOT)}: planners take data, not callables or coroutines: {found}"


@pytest.mark.parametrize("path", PLANNING + INPUTS, ids=lambda p: p.name)
def test_no_planner_reaches_io(path: Path) -> None:
    bad = {name: chain for name, chain in reached(path).items() if forbidden(name)}
    assert not bad, (
        f"{path.relative_to(ROOT)} reaches I/O modules (planners read views, observe/ reads the "
        f"cluster and the store): {[' -> '.join(c) for c in bad.values()]}"
    )


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """The checks are not empty: a planner with a callable input, a coroutine, and an import of kube."""
    src = (
        "from collections.abc import Awaitable, Callable\n"
        "from trtforge_operator import kube\n"
        "class Obs:\n    lookup: Callable[[str], int]\n"
        "def plan(obs: Obs, manifests: Callable[[str], int]) -> None: ...\n"
        "async def fetch(k: str) -> Awaitable[int]: ...\n"
    )
    assert sorted(callable_annotations(src, "x.py")) == ["Obs.lookup", "async def fetch", "plan(manifests)"]
    aliased = "Lookup = Callable[[str], int]\ndef plan(m: Lookup) -> None: ...\n"
    assert callable_annotations(aliased, "y.py") == ["plan(m)"]
    bad = tmp_path / "bad.py"
    bad.write_text(src)
    assert forbidden("trtforge_operator.kube") and "trtforge_operator.kube" in imports(bad)
    assert not forbidden("trtforge_operator.kubernetes_names") and forbidden("kubernetes.client")
