"""`trtforge serve` over the v2 gRPC protocol (grpc.aio), driven by `tritonclient.grpc` (a client no
one here wrote).

Engines are real builds (ResNet-50 and a dynamic-batch MLP, as in test_serve.py); answers are
compared with ONNX Runtime run directly on the source models. HTTP and gRPC share one batcher,
one set of limits and metrics, and one readiness.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException
from trtforge_dev.serve_engines import (
    RESNET_IN,
    RESNET_OUT,
    Bed,
    copy_engine,
    make_bed,
    perturb_canary,
    run_ort,
    termination,
)

from tests.integration.serve_process import Server, metric_in

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Bed:
    return make_bed(tmp_path_factory.mktemp("grpc"), mlp_seed=3)


@pytest.fixture(scope="module")
def resnet_server(bed: Bed) -> Iterator[Server]:
    s = Server(bed.store, bed.resnet_key, bed.tmp, bed.gpu_file, "--max-queue", "2")
    s.wait()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def mlp_server(bed: Bed) -> Iterator[Server]:
    s = Server(
        bed.store,
        bed.mlp_key,
        bed.tmp,
        bed.gpu_file,
        "--max-queue-delay-us",
        "2000",
        "--max-request-bytes",
        "100000",
    )
    s.wait()
    yield s
    s.stop()


def _refused(
    status: str, call: Callable[..., object], *args: Any, match: str | None = None, **kw: Any
) -> None:
    """`call(*args, **kw)` fails with gRPC status `status` (and a message matching `match`)."""
    with pytest.raises(InferenceServerException, match=match) as e:
        call(*args, **kw)
    assert str(e.value.status()) == f"StatusCode.{status}", e.value


def test_grpc_health_metadata_and_resnet50_match_onnxruntime(bed: Bed, resnet_server: Server) -> None:
    c = grpcclient.InferenceServerClient(resnet_server.grpc_url)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("resnet50")
    meta = c.get_model_metadata("resnet50", as_json=True)
    assert meta["name"] == "resnet50" and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [{"name": RESNET_IN, "datatype": "FP32", "shape": ["1", "3", "224", "224"]}]
    assert c.get_server_metadata().name == "trtforge"
    x = np.random.default_rng(4).standard_normal((1, 3, 224, 224)).astype(np.float32)
    inp = grpcclient.InferInput(RESNET_IN, [1, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(x)
    result = c.infer("resnet50", [inp], request_id="r-1")
    np.testing.assert_allclose(
        result.as_numpy(RESNET_OUT), run_ort(bed.resnet, {RESNET_IN: x})[RESNET_OUT], rtol=1e-5, atol=1e-6
    )
    assert result.get_response().id == "r-1"
    _refused("NOT_FOUND", c.is_model_ready, "nope")
    c.close()


def _health(url: str, service: str) -> int:
    """The status grpc.health.v1.Health/Check answers for `service`, asked with grpcio-health-checking's
    stub (what Kubernetes' grpc probes send)."""
    with grpc.insecure_channel(url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status)


def test_grpc_health_checking_protocol_for_probes(resnet_server: Server) -> None:
    url = resnet_server.grpc_url
    serving = health_pb2.HealthCheckResponse.SERVING
    assert _health(url, "") == _health(url, "inference.GRPCInferenceService") == serving
    assert _health(url, "liveness") == serving
    with pytest.raises(grpc.RpcError) as e:
        _health(url, "inference.Nope")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "'liveness'" in str(e.value.details())
    with grpc.insecure_channel(url) as channel:  # Watch, a server stream, is not served
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=10)
        with pytest.raises(grpc.RpcError) as e:
            next(iter(watch))
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_grpc_and_http_share_one_batcher_and_its_metrics(bed: Bed, mlp_server: Server) -> None:
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((int(rng.integers(1, 4)), 64)).astype(np.float32) for _ in range(32 * 4)]
    refs = [run_ort(bed.mlp, {"x": x})["y"] for x in xs]

    async def client(i: int) -> int:
        api: Any = grpcaio if i % 2 else httpaio  # the same client API over either protocol
        c = api.InferenceServerClient(mlp_server.grpc_url if i % 2 else mlp_server.url)
        try:
            for j in range(i, len(xs), 32):
                inp = api.InferInput("x", list(xs[j].shape), "FP32")
                inp.set_data_from_numpy(xs[j])
                got = (await c.infer("mlp", [inp])).as_numpy("y")
                np.testing.assert_allclose(got, refs[j], rtol=1e-5, atol=1e-6)
            return 1
        finally:
            await c.close()

    async def main() -> list[int]:
        return await asyncio.gather(*(client(i) for i in range(32)))

    assert sum(asyncio.run(main())) == 32
    metrics = mlp_server.metrics()
    assert metric_in(metrics, 'trtforge_runtime_requests_total{model="mlp",outcome="success"}') == len(xs)
    assert metric_in(metrics, 'trtforge_runtime_batch_size_count{model="mlp"}') < len(xs), (
        "no two requests shared a batch"
    )


def test_model_configuration_over_http_and_grpc_is_what_tritons_tools_read(
    resnet_server: Server, mlp_server: Server
) -> None:
    """Triton's model-configuration extension, asked by tritonclient over both protocols: the same
    configuration, its dims without the batch dimension of a batchable model (as Triton's)."""
    h = httpclient.InferenceServerClient(mlp_server.url)
    g = grpcclient.InferenceServerClient(mlp_server.grpc_url)
    over_http = h.get_model_config("mlp")
    over_grpc = g.get_model_config("mlp", as_json=True)["config"]
    assert over_http["name"] == over_grpc["name"] == "mlp"
    assert over_http["platform"] == over_grpc["platform"] == "onnxruntime_onnx"
    assert over_http["backend"] == over_grpc["backend"] == "onnxruntime"
    assert over_http["max_batch_size"] == over_grpc["max_batch_size"] == 32
    assert over_http["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [64]}]
    assert over_grpc["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": ["64"]}]  # int64: text
    assert [o["name"] for o in over_http["output"]] == [o["name"] for o in over_grpc["output"]] == ["y"]
    assert over_http["output"][0]["data_type"] == over_grpc["output"][0]["data_type"] == "TYPE_FP32"
    assert over_http["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert over_grpc["dynamic_batching"]["max_queue_delay_microseconds"] == "2000"
    assert g.get_model_config("mlp", "1", as_json=True)["config"]["name"] == "mlp"
    assert h.get_model_config("mlp", "1")["name"] == "mlp"
    _refused("NOT_FOUND", g.get_model_config, "nope", match="unknown model 'nope'")
    _refused("NOT_FOUND", g.get_model_config, "mlp", "2", match="has no version '2'")
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        h.get_model_config("nope")
    # A model that is not batchable: max_batch_size 0, dims as the model declares them.
    r = grpcclient.InferenceServerClient(resnet_server.grpc_url).get_model_config("resnet50").config
    assert r.max_batch_size == 0 and [list(i.dims) for i in r.input] == [[1, 3, 224, 224]]
    assert httpclient.InferenceServerClient(resnet_server.url).get_model_config("resnet50")["input"] == [
        {"name": RESNET_IN, "data_type": "TYPE_FP32", "dims": [1, 3, 224, 224]}
    ]
    h.close()
    g.close()


def test_grpc_bad_input_gets_invalid_argument_naming_the_field(mlp_server: Server) -> None:
    c = grpcclient.InferenceServerClient(mlp_server.grpc_url)
    for shape, datatype, text in [
        ([2, 63], "FP32", r"shape \[2, 63\], expected \[-1, 64\]"),
        ([2, 64], "FP64", "datatype FP64, expected FP32"),
        ([33, 64], "FP32", "exceeds the model's max batch size 32"),
    ]:
        inp = grpcclient.InferInput("x", shape, datatype)
        inp.set_data_from_numpy(np.zeros(shape, np.float64 if datatype == "FP64" else np.float32))
        _refused("INVALID_ARGUMENT", c.infer, "mlp", [inp], match=text)
    inp = grpcclient.InferInput("x", [1, 64], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
    _refused("NOT_FOUND", c.infer, "nope", [inp], match="unknown model 'nope'")
    z = [grpcclient.InferRequestedOutput("z")]
    _refused("INVALID_ARGUMENT", c.infer, "mlp", [inp], outputs=z, match="unknown output 'z'")
    big = grpcclient.InferInput("x", [1000, 64], "FP32")  # 256 kB, over --max-request-bytes
    big.set_data_from_numpy(np.zeros((1000, 64), np.float32))
    _refused("RESOURCE_EXHAUSTED", c.infer, "mlp", [big])
    with grpc.insecure_channel(mlp_server.grpc_url) as ch:  # bytes that are no ModelInferRequest
        infer = ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as e:
            infer(b"\x0a\x7fmlp", timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert "ModelInferRequest does not parse" in (e.value.details() or "")
    c.infer("mlp", [inp])  # and the server carries on
    c.close()


def _resnet50_burst(grpc_url: str, refusal: str, n: int = 12) -> list[str]:
    """`n` ResNet-50 calls at once over gRPC, each on its own client: "ok" or the refusal's status
    for each. Every refusal's message must contain `refusal` (checked here, not in the threads)."""
    x = np.zeros((1, 3, 224, 224), np.float32)
    outcomes: list[str] = []
    messages: list[str] = []

    def one() -> None:
        c = grpcclient.InferenceServerClient(grpc_url)
        inp = grpcclient.InferInput(RESNET_IN, [1, 3, 224, 224], "FP32")
        inp.set_data_from_numpy(x)
        try:
            c.infer("resnet50", [inp])
            outcomes.append("ok")
        except InferenceServerException as e:
            messages.append(str(e.message()))
            outcomes.append(str(e.status()))
        finally:
            c.close()

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(refusal in m for m in messages), messages
    return outcomes


def test_grpc_full_queue_gets_resource_exhausted(resnet_server: Server) -> None:
    """ResNet-50 takes ~100 ms a request here; with 2 queue slots, 12 at once overflow it."""
    outcomes = _resnet50_burst(resnet_server.grpc_url, "queue is full")
    assert "ok" in outcomes and "StatusCode.RESOURCE_EXHAUSTED" in outcomes, outcomes
    assert set(outcomes) <= {"ok", "StatusCode.RESOURCE_EXHAUSTED"}


def test_grpc_messages_share_the_body_memory_budget_with_http(bed: Bed) -> None:
    """With --max-request-bytes 700000 the budget is 1.4 MB: two ResNet-50 inputs (602 KB each) are
    held at once, over both protocols. Twelve gRPC requests at once: those over the budget are
    refused with RESOURCE_EXHAUSTED naming it, the rest answered; afterwards the budget is whole
    again (an HTTP and a gRPC request both pass)."""
    s = Server(bed.store, bed.resnet_key, bed.tmp, bed.gpu_file, "--max-request-bytes", "700000")
    try:
        s.wait()
        outcomes = _resnet50_burst(s.grpc_url, "--max-body-memory")
        assert "ok" in outcomes and "StatusCode.RESOURCE_EXHAUSTED" in outcomes, outcomes
        assert set(outcomes) <= {"ok", "StatusCode.RESOURCE_EXHAUSTED"}
        # counted as the same refusal is over HTTP (503): unavailable, not too_large
        metrics = s.metrics()
        refused = metric_in(
            metrics, 'trtforge_runtime_requests_total{model="resnet50",outcome="unavailable"}'
        )
        assert refused == outcomes.count("StatusCode.RESOURCE_EXHAUSTED"), metrics
        assert 'outcome="too_large"' not in metrics
        assert _resnet50_burst(s.grpc_url, "--max-body-memory", n=1) == ["ok"]
        inp = httpclient.InferInput(RESNET_IN, [1, 3, 224, 224], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32), binary_data=True)
        h = httpclient.InferenceServerClient(s.url)
        assert h.infer("resnet50", [inp]).as_numpy(RESNET_OUT).shape == (1, 1000)
        h.close()
    finally:
        assert s.stop() == 0


def test_grpc_is_unavailable_while_not_ready(bed: Bed) -> None:
    store = bed.tmp / "canary"
    key = copy_engine(bed.store, bed.mlp_key, store)
    perturb_canary(store, key, 0.5)
    s = Server(store, key, bed.tmp, bed.gpu_file, cache=bed.tmp / "cache-canary")
    try:
        s.wait("live")
        c = grpcclient.InferenceServerClient(s.grpc_url)
        while termination(s.term).get("reason") != "CanaryFailed":  # the server stays up, not ready
            assert s.proc.poll() is None, s.output()
            threading.Event().wait(0.05)
        assert c.is_server_live() and not c.is_server_ready() and not c.is_model_ready("mlp")
        assert _health(s.grpc_url, "") == health_pb2.HealthCheckResponse.NOT_SERVING  # readiness probe
        assert _health(s.grpc_url, "liveness") == health_pb2.HealthCheckResponse.SERVING  # never killed
        inp = grpcclient.InferInput("x", [1, 64], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
        _refused("UNAVAILABLE", c.infer, "mlp", [inp], match="not ready: canary failed")
        c.close()
    finally:
        assert s.stop() == 0


def test_grpc_port_in_use_is_a_clear_error(bed: Bed) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        s = Server(bed.store, bed.mlp_key, bed.tmp, bed.gpu_file, "--grpc-port", str(port))
        code = s.exit_code()
        s.stop()
    assert code == 1, s.output()
    assert f"cannot listen for gRPC on 127.0.0.1:{port}" in str(termination(s.term)["message"])
