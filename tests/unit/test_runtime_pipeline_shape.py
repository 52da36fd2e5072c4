"""The runtime's request pipeline is written once (serving.service.Service.infer) and each protocol's
adapter is thin: under 150 lines, never running a pipeline step itself (docs/design.md, "Runtime
protocols")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "runtime_image" / "trtforge_runtime"
# HTTP: aiohttp routes and the HttpInfer wire; gRPC: grpc.aio registration, and its calls with GrpcInfer.
ADAPTERS = ("protocol/http_api.py", "protocol/grpc_service.py", "protocol/grpc_calls.py")
# What only the pipeline does: admit, count and release a call, queue a batch, decode off the loop.
PIPELINE_STEPS = {"admit", "call", "enqueue", "run_in_executor", "batcher", "decode_pool", "inflate_pool"}
MAX_LINES = 150


def _tree(rel: str) -> ast.Module:
    return ast.parse((RUNTIME / rel).read_text(), rel)


@pytest.mark.parametrize("rel", ADAPTERS)
def test_each_protocol_adapter_is_under_150_lines(rel: str) -> None:
    lines = len((RUNTIME / rel).read_text().splitlines())
    assert lines < MAX_LINES, f"{rel} has {lines} lines; a protocol adapter stays under {MAX_LINES}"


def _attributes(tree: ast.AST) -> set[str]:
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def test_no_protocol_module_runs_a_step_of_the_pipeline_itself() -> None:
    for path in sorted((RUNTIME / "protocol").glob("*.py")):
        used = _attributes(_tree(f"protocol/{path.name}")) & PIPELINE_STEPS
        assert not used, f"protocol/{path.name} does {sorted(used)} itself: the service's pipeline does"


def test_both_protocols_hand_inference_to_the_one_pipeline() -> None:
    callers = set()
    for path in sorted((RUNTIME / "protocol").glob("*.py")):
        for n in ast.walk(_tree(f"protocol/{path.name}")):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "infer":
                callers.add(path.name)
    assert callers == {"http_api.py", "grpc_calls.py"}  # HttpInfer and GrpcInfer, each a Wire
    steps = {n.name for n in ast.walk(_tree("serving/service.py")) if isinstance(n, ast.AsyncFunctionDef)}
    assert "infer" in steps


def test_the_pipeline_knows_no_protocol() -> None:
    for path in sorted((RUNTIME / "serving").glob("*.py")):
        for n in ast.walk(_tree(f"serving/{path.name}")):
            if isinstance(n, ast.ImportFrom) and n.module is not None:
                assert not n.module.startswith("trtforge_runtime.protocol"), (
                    f"serving/{path.name} imports {n.module}: the pipeline must not depend on a protocol"
                )
