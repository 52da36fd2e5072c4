"""Both reconciles have one shape: each kind's handler reads as observe → plan → apply
(docs/design.md §"Observe, plan, apply").

Read from the source (AST): every function of the kinds' handler modules (and of the timers' that
delete finished build Jobs and unreferenced engines) has a body of at most 15 steps (statements,
nested ones counted, the docstring not) and at most 6 returns, and each kind's pass (`reconcile_*`)
is exactly three calls, in order: an `observe_*`, a `plan_*`, an `apply_*`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = ROOT / "operator" / "trtforge_operator" / "handlers"
KIND_HANDLERS = [HANDLERS / "engine.py", HANDLERS / "deployment.py"]
TIMERS = [HANDLERS / "finished_jobs.py", HANDLERS / "gc.py"]  # passes of no kind: bodies walked too
MAX_STEPS = 15
MAX_RETURNS = 6
SHAPE = ("observe_", "plan_", "apply_")

Function = ast.FunctionDef | ast.AsyncFunctionDef


def functions(source: str) -> list[Function]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, Function)]


def body(fn: Function) -> list[ast.stmt]:
    """The function's statements, its docstring left out."""
    first = fn.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return fn.body[1:] if docstring and isinstance(first.value.value, str) else fn.body


def steps(fn: Function) -> int:
    return sum(1 for stmt in body(fn) for n in ast.walk(stmt) if isinstance(n, ast.stmt))


def returns(fn: Function) -> int:
    return sum(1 for n in ast.walk(fn) if isinstance(n, ast.Return))


def calls_in_order(fn: Function) -> list[str]:
    """The names of the functions a body calls, statement by statement (outermost call of each)."""
    out: list[str] = []
    for stmt in body(fn):
        value = stmt.value if isinstance(stmt, ast.Assign | ast.Expr | ast.Return) else None
        if isinstance(value, ast.Await):
            value = value.value
        if isinstance(value, ast.Call):
            out.append(ast.unparse(value.func).rsplit(".", 1)[-1])
        else:
            out.append(type(stmt).__name__)
    return out


def problems(source: str) -> list[str]:
    found: list[str] = []
    for fn in functions(source):
        if steps(fn) > MAX_STEPS:
            found.append(f"{fn.name}: {steps(fn)} steps (at most {MAX_STEPS})")
        if returns(fn) > MAX_RETURNS:
            found.append(f"{fn.name}: {returns(fn)} returns (at most {MAX_RETURNS})")
        if fn.name.startswith("reconcile_"):
            calls = calls_in_order(fn)
            if len(calls) != len(SHAPE) or not all(
                c.startswith(p) for c, p in zip(calls, SHAPE, strict=True)
            ):
                found.append(f"{fn.name}: {' -> '.join(calls)}, not observe_* -> plan_* -> apply_*")
    return found


@pytest.mark.parametrize("path", KIND_HANDLERS, ids=lambda p: p.name)
def test_each_kinds_handler_reads_as_observe_plan_apply(path: Path) -> None:
    source = path.read_text()
    assert any(fn.name.startswith("reconcile_") for fn in functions(source)), f"{path.name}: no reconcile_*"
    assert not problems(source), f"{path.relative_to(ROOT)}: {problems(source)}"


@pytest.mark.parametrize("path", TIMERS, ids=lambda p: p.name)
def test_the_timers_passes_are_short(path: Path) -> None:
    assert not problems(path.read_text()), f"{path.relative_to(ROOT)}: {problems(path.read_text())}"


def test_the_walk_finds_long_handlers_and_other_shapes() -> None:
    """The checks are not empty: a long body, many returns, and a pass of another shape fail."""
    long = "async def reconcile_x(s, b, i):\n" + "".join(f"    a{n} = {n}\n" for n in range(16))
    assert problems(long)[0] == "reconcile_x: 16 steps (at most 15)"
    branches = "def f(x):\n" + "".join(f"    if x == {n}:\n        return {n}\n" for n in range(7))
    assert "f: 7 returns (at most 6)" in problems(branches)
    nested = "def g(x):\n    for y in x:\n" + "".join(f"        z{n} = y\n" for n in range(15))
    assert problems(nested) == ["g: 16 steps (at most 15)"]
    fine = (
        "async def reconcile_x(s, b, i):\n    '''doc'''\n    obs = await observe_x(s, b, i)\n"
        "    plan = plan_x(obs, s.cfg)\n    return await apply_x(s, b, obs, plan)\n"
    )
    assert problems(fine) == []
    inline = fine.replace(
        "    plan = plan_x(obs, s.cfg)\n", "    plan = plan_x(obs, s.cfg)\n    s.metrics.inc()\n"
    )
    assert problems(inline) == [
        "reconcile_x: observe_x -> plan_x -> inc -> apply_x, not observe_* -> plan_* -> apply_*"
    ]
