"""benchmarks.loadgen's gRPC clients, the Python one (benchmarks/h2client.py) and the native one
(benchmarks/native/v2load.c, built with cc), against a real gRPC server (grpcio's, serving
ModelInfer with tritonclient's own messages) over a real socket: answers checked in both of the
protocol's layouts, flow control on messages larger than the windows, statuses, wrong answers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from benchmarks.loadgen import Check, LoadResult, run_load

X = np.arange(6, dtype=np.float32).reshape(1, 6)


class _Model:
    """y = 2 x + offset, as ModelInfer answers it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.inline = False  # the output in outputs[0].contents.fp32_contents, not raw_output_contents
        self.offset = 0.0  # not 0: a wrong answer
        self.output = "y"  # the name the answer gives its output
        self.refuse = False  # abort every call with INVALID_ARGUMENT
        self.delay = 0.0  # seconds each call takes at least

    def infer(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        with self.lock:
            self.calls += 1
        time.sleep(self.delay)
        if self.refuse:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused on purpose")
        req = service_pb2.ModelInferRequest.FromString(request)
        x = np.frombuffer(req.raw_input_contents[0], np.float32)
        y = (2 * x + self.offset).astype(np.float32)
        res = service_pb2.ModelInferResponse(model_name=req.model_name, id=req.id)
        out = res.outputs.add()
        out.name, out.datatype = self.output, "FP32"
        out.shape.extend([1, y.size])
        if self.inline:
            out.contents.fp32_contents.extend(y.tolist())
        else:
            res.raw_output_contents.append(y.tobytes())
        data: bytes = res.SerializeToString()
        return data


@pytest.fixture
def model() -> Iterator[tuple[_Model, int]]:
    m = _Model()
    srv = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
    )
    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(m.infer)}
    )
    srv.add_generic_rpc_handlers((handler,))
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        yield m, port
    finally:
        srv.stop(None)


@pytest.fixture(params=["python", "native"])
def client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _load(
    port: int,
    client: str,
    x: np.ndarray,
    check: Check | None,
    concurrency: int = 4,
    max_requests: int = 100,
    warmup: float = 0.0,
) -> LoadResult:
    # The run ends at `max_requests`; its window (a day) never ends it, so no count depends on time.
    url = f"grpc://127.0.0.1:{port}"
    res, _ = run_load(
        "grpc", url, "m", "x", "y", x, concurrency, 86_400.0, warmup, max_requests, check, client=client
    )
    assert res.client == client
    return res


def test_every_answer_is_read_and_checked(model: tuple[_Model, int], client: str) -> None:
    m, port = model
    res = _load(port, client, X, Check("y", 2 * X))
    assert (res.errors, res.completed, m.calls) == (0, 100, 100)


def test_answers_with_the_output_inline_are_checked_too(model: tuple[_Model, int], client: str) -> None:
    m, port = model
    m.inline = True
    res = _load(port, client, X, Check("y", 2 * X), max_requests=40)
    assert (res.errors, res.completed) == (0, 40)
    m.offset = 1.0
    res = _load(port, client, X, Check("y", 2 * X), max_requests=8)
    assert (res.errors, res.completed) == (8, 0)


def test_messages_larger_than_the_windows_wait_for_them(model: tuple[_Model, int], client: str) -> None:
    _, port = model
    big = np.arange(300_000, dtype=np.float32).reshape(1, -1)  # 1.2 MB: past the default 64 KiB windows
    res = _load(port, client, big, Check("y", 2 * big), concurrency=2, max_requests=12)
    assert (res.errors, res.completed) == (0, 12)


def test_wrong_answers_and_missing_outputs_count_as_errors(model: tuple[_Model, int], client: str) -> None:
    m, port = model
    m.offset = 1.0
    res = _load(port, client, X, Check("y", 2 * X), max_requests=10)
    assert (res.errors, res.completed) == (10, 0)
    assert "wrong answer: max abs error 1 > 0.0001" in res.error_samples[0]
    m.offset, m.output = 0.0, "z"
    res = _load(port, client, X, Check("y", 2 * X), max_requests=4)
    assert res.errors == 4 and "no output" in res.error_samples[0]


def test_a_refused_call_is_an_error_and_the_connection_serves_on(
    model: tuple[_Model, int], client: str
) -> None:
    m, port = model
    m.refuse = True
    res = _load(port, client, X, None, concurrency=1, max_requests=3)
    assert (res.errors, res.completed, m.calls) == (3, 0, 3)
    m.refuse = False
    res = _load(port, client, X, Check("y", 2 * X), concurrency=1, max_requests=3)
    assert (res.errors, res.completed) == (0, 3)


def test_the_throughput_counts_each_request_by_its_part_inside_the_window(
    model: tuple[_Model, int], client: str
) -> None:
    m, port = model
    res = _load(port, client, X, Check("y", 2 * X))  # every request inside the window: whole ones
    assert res.throughput == pytest.approx(res.window_throughput, rel=1e-3)
    # One worker; the first call, sent at the start, is answered at least 0.2 s later, after the
    # 0.1 s warm-up: half of it or more lies inside the window, and not all of it.
    m.delay = 0.2
    res = _load(port, client, X, Check("y", 2 * X), concurrency=1, max_requests=3, warmup=0.1)
    assert res.completed == 3
    assert 2.45 < res.throughput * res.seconds < 2.99
    m.delay, m.refuse = 0.0, True  # refused calls count for nothing
    res = _load(port, client, X, None, concurrency=1, max_requests=3)
    assert (res.errors, res.throughput) == (3, 0.0)
