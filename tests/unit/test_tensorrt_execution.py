"""The TensorRT layer's execution rules, driven through stand-ins for the engine and CUDA.

What is checked is the order of calls this layer makes (its decisions), not TensorRT: that a refused
shape is an error naming the input, that shape tensors stay on the host, that the profile is chosen
per batch, that nothing is freed while work may be queued, and that close() releases everything
once. Against the real TensorRT these run in the builder image (tests/unit/test_build_tensorrt.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from trtforge.contract.engine_key import ShapeRange
from trtforge.tensorrt.engine import Execution, ExecutionError, TensorInfo


class FakeCuda:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.next_ptr = 0x1000
        self.live: set[int] = set()

    def stream(self) -> int:
        self.calls.append(("stream", 7))
        return 7

    def malloc(self, n: int) -> int:
        self.next_ptr += 0x1000
        self.live.add(self.next_ptr)
        self.calls.append(("malloc", n))
        return self.next_ptr

    def free(self, p: int) -> None:
        self.live.discard(p)
        self.calls.append(("free", p))

    def copy_async(self, dst: int, src: int, n: int, kind: int, stream: int) -> None:
        self.calls.append(("copy", kind))

    def synchronize(self, stream: int) -> None:
        self.calls.append(("sync", stream))

    def last_error(self) -> int:
        return 0

    def destroy_stream(self, stream: int) -> None:
        self.calls.append(("destroy", stream))


class FakeContext:
    def __init__(self, engine: FakeEngine, profile_log: list[int]) -> None:
        self.engine = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.profile_log = profile_log

    def set_optimization_profile_async(self, i: int, stream: int) -> bool:
        self.profile_log.append(i)
        return True

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        if shape and shape[0] == 5:  # a shape this engine refuses
            return False
        self.shapes[name] = shape
        return True

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def infer_shapes(self) -> list[str]:
        return []

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return (self.shapes["x"][0], 4)

    def execute_async_v3(self, stream: int) -> bool:
        return not self.engine.fail


class FakeEngine:
    def __init__(self) -> None:
        self.fail = False
        self.profiles: list[int] = []

    def create_execution_context(self) -> FakeContext:
        return FakeContext(self, self.profiles)


class FakeLoaded:
    def __init__(self) -> None:
        self.engine = FakeEngine()
        self.logger = type("L", (), {"errors": []})()
        self.tensors = {
            "x": TensorInfo("x", True, np.dtype(np.float32), False),
            "n": TensorInfo("n", True, np.dtype(np.int64), True),  # a shape tensor
            "y": TensorInfo("y", False, np.dtype(np.float32), False),
        }
        self.profiles = [
            {"x": ShapeRange(min=(1, 3), opt=(2, 3), max=(4, 3))},
            {"x": ShapeRange(min=(8, 3), opt=(8, 3), max=(16, 3))},
        ]

    @property
    def inputs(self) -> list[TensorInfo]:
        return [t for t in self.tensors.values() if t.is_input]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [t for t in self.tensors.values() if not t.is_input]


def feeds(batch: int) -> dict[str, np.ndarray]:
    return {"x": np.zeros((batch, 3), np.float32), "n": np.array([batch], np.int64)}


def make() -> tuple[Execution, FakeCuda, FakeLoaded]:
    cuda, loaded = FakeCuda(), FakeLoaded()
    return Execution(loaded, cuda), cuda, loaded  # type: ignore[arg-type]


def test_profile_per_batch_and_shape_tensors_on_the_host() -> None:
    ex, cuda, loaded = make()
    out = ex.run(feeds(2))
    assert out["y"].shape == (2, 4)
    out = ex.run(feeds(12))  # only profile 1 fits: a second context, switched to it
    assert out["y"].shape == (12, 4) and loaded.engine.profiles == [1]
    ctx = ex._contexts[1]
    assert ctx.addresses["n"] == ex._host[(1, "n")].ctypes.data  # host memory, never copied to the GPU
    assert [c for c in cuda.calls if c[0] == "malloc"] == [
        ("malloc", 24),
        ("malloc", 32),
        ("malloc", 144),
        ("malloc", 192),
    ]


def test_a_refused_shape_names_the_input_and_no_fitting_profile_says_so() -> None:
    ex, _, loaded = make()
    loaded.profiles = [{"x": ShapeRange(min=(1, 3), opt=(2, 3), max=(8, 3))}]
    with pytest.raises(ExecutionError, match=r"refused shape \[5, 3\] for input 'x' \(profile 0\)"):
        ex.run(feeds(5))  # set_input_shape returned False: checked, not ignored
    with pytest.raises(ExecutionError, match=r"no optimization profile fits x \[64, 3\]"):
        ex.run(feeds(64))


def test_buffers_are_freed_only_after_a_sync_and_close_releases_everything_once() -> None:
    ex, cuda, loaded = make()
    ex.run(feeds(1))
    ex.run(feeds(4))  # larger: the old buffers are replaced, after a sync
    calls = cuda.calls
    first_free = next(i for i, c in enumerate(calls) if c[0] == "free")
    assert calls[first_free - 1][0] == "sync"
    loaded.engine.fail = True
    with pytest.raises(ExecutionError, match="execute_async_v3 failed"):
        ex.run(feeds(4))
    assert calls[-1] == ("sync", 7)  # after an error the stream is drained before anything else
    n = len(calls)
    ex.close()
    tail = calls[n:]
    assert tail[0] == ("sync", 7) and tail[-1] == ("destroy", 7)
    assert not cuda.live  # every buffer freed
    ex.close()
    assert len(calls) == n + len(tail)  # idempotent
    with pytest.raises(ExecutionError, match="closed"):
        ex.run(feeds(1))
