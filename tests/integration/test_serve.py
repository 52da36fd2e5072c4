"""`trtforge serve` as a real subprocess on a loopback port, driven by `tritonclient` (no Kubernetes).

Engines are what the real builder (`trtforge_builder`) publishes into a local store, built once per
module from `trtforge_dev.modelzoo` models (ResNet-50 from the onnx package's test data with its weights
materialised, and a dynamic-batch MLP) for the emulated H100 that the serve processes probe too;
outputs are compared with ONNX Runtime run directly on the source models. One test serves a copy of
the MLP's from S3 (moto's server on loopback). The negative scenarios copy a built engine and break
one thing in it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from trtforge_dev.serve_engines import (
    H100_UUID,
    RESNET_IN,
    RESNET_OUT,
    Bed,
    copy_engine,
    inject_xid,
    make_bed,
    perturb_canary,
    run_ort,
    tamper_engine,
    termination,
    write_gpu_file,
)
from trtforge_dev.testbed.procs import free_port

from tests.integration.serve_process import Server, metric_in, metric_value, serve_once
from trtforge.contract.gpu import GPUTarget
from trtforge.contract.termination import EXIT_ENGINE_INTEGRITY, EXIT_GPU_FAULT, EXIT_GPU_MISMATCH

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Bed:
    return make_bed(tmp_path_factory.mktemp("serve"), mlp_seed=1)


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
        "10000",
    )
    s.wait()
    yield s
    s.stop()


def test_resnet50_binary_and_json_match_onnxruntime(bed: Bed, resnet_server: Server) -> None:
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224)).astype(np.float32)
    ref = run_ort(bed.resnet, {RESNET_IN: x})[RESNET_OUT]
    c = httpclient.InferenceServerClient(resnet_server.url)
    assert c.is_server_live() and c.is_server_ready() and c.is_model_ready("resnet50")
    meta = c.get_model_metadata("resnet50")
    assert meta["inputs"] == [{"name": RESNET_IN, "datatype": "FP32", "shape": [1, 3, 224, 224]}]
    for binary in (True, False):
        inp = httpclient.InferInput(RESNET_IN, [1, 3, 224, 224], "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput(RESNET_OUT, binary_data=binary)
        got = c.infer("resnet50", [inp], outputs=[out]).as_numpy(RESNET_OUT)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    # tritonclient's defaults: binary input, no outputs named (binary_data_output).
    inp = httpclient.InferInput(RESNET_IN, [1, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_allclose(c.infer("resnet50", [inp]).as_numpy(RESNET_OUT), ref, rtol=1e-5, atol=1e-6)


def test_an_engine_on_a_mounted_store_serves_from_the_session_pre_loaded_at_start(
    bed: Bed, resnet_server: Server
) -> None:
    # the store is a local directory, as a mounted PVC is to the pod: the session was opened from the
    # pre-hashed file while the contract imported, and the backend took it
    # (trtforge_runtime.lifecycle.preload)
    events = _wait_for_log(resnet_server, "ready")
    assert [e["msg"] for e in events if e.get("msg") == "engine session pre-loaded"]
    (ready,) = [e for e in events if e.get("msg") == "onnxruntime session ready"]
    assert ready["preloaded"] is True
    # and a restart (the markers vouch; nothing is hashed) takes its pre-loaded session too
    restart = Server(bed.store, bed.resnet_key, bed.tmp, bed.gpu_file, cache=resnet_server.cache)
    try:
        restart.wait()
        events = _wait_for_log(restart, "ready")
        (ready,) = [e for e in events if e.get("msg") == "onnxruntime session ready"]
        assert ready["preloaded"] is True
        assert not [e for e in events if e.get("msg") == "verified in place"]
    finally:
        assert restart.stop() == 0


def test_full_queue_answers_503_with_retry_after(resnet_server: Server) -> None:
    """ResNet-50 takes ~100 ms a request here; with 2 queue slots, 12 at once overflow it."""
    x = np.zeros((1, 3, 224, 224), np.float32)
    statuses: list[int] = []
    retry_after: list[str | None] = []

    def one() -> None:
        body = json.dumps(
            {
                "inputs": [
                    {
                        "name": RESNET_IN,
                        "datatype": "FP32",
                        "shape": [1, 3, 224, 224],
                        "parameters": {"binary_data_size": x.nbytes},
                    }
                ]
            }
        ).encode()
        req = urllib.request.Request(
            f"http://{resnet_server.url}/v2/models/resnet50/infer",
            data=body + x.tobytes(),
            headers={"Inference-Header-Content-Length": str(len(body))},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                statuses.append(r.status)
        except urllib.error.HTTPError as e:
            statuses.append(e.code)
            retry_after.append(e.headers.get("Retry-After"))
            assert "queue is full" in json.loads(e.read())["error"]

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 503 in statuses and 200 in statuses, statuses
    assert set(statuses) <= {200, 503}
    assert all(r == "1" for r in retry_after)


def _wait_for_log(s: Server, msg: str, timeout: float = 60.0) -> list[dict[str, object]]:
    """Every JSON log line of `s`, once one with message `msg` has appeared."""
    deadline = time.monotonic() + timeout
    while True:
        events = []
        for line in s.output().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        if any(e.get("msg") == msg for e in events):
            return events
        assert time.monotonic() < deadline, f"no {msg!r} in the log:\n{s.output()}"
        time.sleep(0.05)


def _collector_resumed(events: list[dict[str, object]]) -> dict[str, object]:
    """The start-up's last word: the garbage collector, paused for start-up, is on again, with the
    objects start-up made frozen (trtforge_runtime.lifecycle.startup_gc)."""
    done = [e for e in events if e.get("msg") == "start-up done; garbage collection on"]
    assert len(done) == 1, events
    frozen = done[0]["frozen_objects"]
    assert isinstance(frozen, int) and frozen > 10_000, done  # the modules alone are tens of thousands
    return done[0]


@pytest.mark.asyncio
async def test_dynamic_batching_64_concurrent_clients(bed: Bed, mlp_server: Server) -> None:
    rng = np.random.default_rng(5)
    xs = [rng.standard_normal((int(rng.integers(1, 4)), 64)).astype(np.float32) for _ in range(64 * 4)]
    refs = [run_ort(bed.mlp, {"x": x})["y"] for x in xs]

    async def client(i: int) -> int:
        c = aioclient.InferenceServerClient(mlp_server.url)
        try:
            for j in range(i, len(xs), 64):
                inp = aioclient.InferInput("x", list(xs[j].shape), "FP32")
                inp.set_data_from_numpy(xs[j], binary_data=j % 2 == 0)
                out = aioclient.InferRequestedOutput("y", binary_data=j % 3 != 0)
                got = (await c.infer("mlp", [inp], outputs=[out])).as_numpy("y")
                np.testing.assert_allclose(got, refs[j], rtol=1e-5, atol=1e-6)
            return 1
        finally:
            await c.close()

    assert sum(await asyncio.gather(*(client(i) for i in range(64)))) == 64
    metrics = mlp_server.metrics()
    batches = metric_in(metrics, 'trtforge_runtime_batch_size_count{model="mlp"}')
    singles = metric_in(metrics, 'trtforge_runtime_batch_size_bucket{le="1.0",model="mlp"}')
    assert batches < len(xs), "no two requests ever shared a batch"
    assert batches - singles > 0
    assert 'outcome="success"} 256.0' in metrics
    assert 'outcome="error"' not in metrics and 'outcome="unavailable"' not in metrics


def test_errors_are_json_with_the_right_status(mlp_server: Server) -> None:
    assert mlp_server.get("/v2/models/nope")[0] == 404
    assert mlp_server.get("/v2/models/mlp/versions/7")[0] == 404
    c = httpclient.InferenceServerClient(mlp_server.url)
    bad = httpclient.InferInput("x", [2, 63], "FP32")
    bad.set_data_from_numpy(np.zeros((2, 63), np.float32))
    with pytest.raises(Exception, match=r"shape \[2, 63\], expected \[-1, 64\]"):
        c.infer("mlp", [bad])
    big = httpclient.InferInput("x", [32, 64], "FP32")
    big.set_data_from_numpy(
        np.random.default_rng(0).random((32, 64), np.float32), binary_data=False
    )  # ~40 kB
    with pytest.raises(Exception, match="exceeds the limit"):
        c.infer("mlp", [big])
    over = httpclient.InferInput("x", [33, 64], "FP32")
    over.set_data_from_numpy(np.zeros((33, 64), np.float32))
    with pytest.raises(Exception, match="exceeds the model's max batch size 32"):
        c.infer("mlp", [over])
    req = urllib.request.Request(
        f"http://{mlp_server.url}/v2/models/mlp/infer", data=b"{not json", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and "not valid" in json.loads(e.value.read())["error"]


def _engine_copy(bed: Bed, name: str, gpu: GPUTarget | None = None) -> tuple[Path, str]:
    """The built MLP engine copied into a store of its own (for another GPU when `gpu` is given)."""
    store = bed.tmp / name
    return store, copy_engine(bed.store, bed.mlp_key, store, gpu=gpu)


def test_tampered_engine_is_refused(bed: Bed) -> None:
    store, key = _engine_copy(bed, "tampered")
    artifact = tamper_engine(store, key)
    s = Server(store, key, bed.tmp, bed.gpu_file, cache=bed.tmp / "cache-tampered")
    assert s.exit_code() == EXIT_ENGINE_INTEGRITY, s.output()
    s.stop()
    msg = termination(s.term)
    assert msg["reason"] == "EngineIntegrity"
    assert "does not match the manifest" in str(msg["message"]) and "tampered" in str(msg["message"])
    assert artifact.suffix == ".onnx" and not list((bed.tmp / "cache-tampered").rglob("*.onnx"))


def test_engine_for_another_gpu_is_refused(bed: Bed) -> None:
    store, key = _engine_copy(bed, "b200", gpu=GPUTarget(gpu="NVIDIA-B200"))
    s = Server(store, key, bed.tmp, bed.gpu_file)
    assert s.exit_code() == EXIT_GPU_MISMATCH, s.output()
    s.stop()
    msg = termination(s.term)
    assert msg["reason"] == "GPUMismatch"
    assert "built for NVIDIA-B200" in str(msg["message"]) and "NVIDIA-H100-80GB-HBM3" in str(msg["message"])
    assert "compute capability" in str(msg["message"])


def test_canary_mismatch_keeps_the_server_not_ready(bed: Bed) -> None:
    store, key = _engine_copy(bed, "canary")
    perturb_canary(store, key, 0.5)
    s = Server(store, key, bed.tmp, bed.gpu_file, cache=bed.tmp / "cache-canary")
    try:
        s.wait("live")
        deadline = time.monotonic() + 30
        while "canary" not in str(s.get("/v2/health/ready")[1]) and time.monotonic() < deadline:
            time.sleep(0.05)
        status, body = s.get("/v2/health/ready")
        assert status == 503 and "canary failed" in str(body["error"]), body
        assert s.get("/v2/models/mlp/ready")[0] == 503
        c = httpclient.InferenceServerClient(s.url)
        inp = httpclient.InferInput("x", [1, 64], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 64), np.float32))
        with pytest.raises(Exception, match="not ready: canary failed"):
            c.infer("mlp", [inp])
        assert termination(s.term)["reason"] == "CanaryFailed"
        assert s.proc.poll() is None
        # Start-up ended without serving: the collector is on again all the same.
        _collector_resumed(_wait_for_log(s, "start-up done; garbage collection on"))
    finally:
        assert s.stop() == 0


def test_gpu_fault_exits_with_the_fault_message_and_restart_uses_the_cache(bed: Bed) -> None:
    gpu_file = write_gpu_file(bed.tmp / "gpus-fault.json")
    cache = bed.tmp / "cache-fault"
    s = Server(bed.store, bed.mlp_key, bed.tmp, gpu_file, cache=cache)
    s.wait()
    inject_xid(gpu_file, 79)
    # The fault, not a timeout or a signal, ends the process: its code and message say so. How soon is
    # a timing, measured by benchmarks, not asserted here.
    code = s.exit_code(timeout=120)
    s.stop()
    assert code == EXIT_GPU_FAULT, s.output()
    msg = termination(s.term)
    assert (msg["reason"], msg["xid"], msg["gpu"]) == ("GPUFault", 79, H100_UUID)
    assert (
        json.loads(s.output().strip().splitlines()[-1])["reason"] == "GPUFault"
    )  # also the last stdout line

    # The restarted container finds the verified engine in its volume and downloads nothing.
    again = Server(bed.store, bed.mlp_key, bed.tmp, write_gpu_file(bed.tmp / "gpus-ok.json"), cache=cache)
    try:
        again.wait()
        assert '"fetched_bytes": 0' in again.output()
    finally:
        again.stop()


def test_from_s3_the_engine_loads_from_memory_and_a_restart_uses_its_cache_copy(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a store that downloads (S3: moto's server on loopback), the engine file is verified and
    loaded in memory, its cache copy lands whole behind it, and a container restart with the same
    cache volume serves without downloading (trtforge_runtime.lifecycle.staging)."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    try:
        env = {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        }
        for k in [k for k in os.environ if k.startswith("AWS_") or k.upper().endswith("_PROXY")]:
            monkeypatch.delenv(k)  # nothing beyond the store's settings
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("HOME", str(bed.tmp / "home-s3"))  # no shared AWS config file
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1")
        s3.create_bucket(Bucket="engines")
        engine = bed.store / "engines" / bed.mlp_key
        files = sorted((p for p in engine.iterdir() if p.is_file()), key=lambda p: p.name == "manifest.json")
        for f in files:  # the manifest last: it is the commit
            s3.upload_file(str(f), "engines", f"store/engines/{bed.mlp_key}/{f.name}")
        cache = bed.tmp / "cache-s3"  # an empty cache, as in a new pod
        assert not cache.exists()
        first = Server("s3://engines/store", bed.mlp_key, bed.tmp, bed.gpu_file, cache=cache)
        try:
            first.wait()
            events = _wait_for_log(first, "cache copy written")
            x = np.ones((2, 64), np.float32)
            inp = httpclient.InferInput("x", [2, 64], "FP32")
            inp.set_data_from_numpy(x)
            client = httpclient.InferenceServerClient(first.url)
            try:
                got = client.infer("mlp", [inp]).as_numpy("y")
            finally:
                client.close()
        finally:
            first.stop()
        np.testing.assert_allclose(got, run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)
        manifest = json.loads((engine / "manifest.json").read_text())
        fetched = [e for e in events if e.get("msg") == "fetched"]
        staged = {Path(str(e["path"])).name: e["staged"] for e in fetched}
        assert staged == {manifest["engine_file"]: "memory", manifest["canary"]["file"]: "disk"}, fetched
        assert not [e for e in events if e.get("level") == "warning"], events
        copy = cache / bed.mlp_key / manifest["engine_file"]
        assert copy.read_bytes() == (engine / manifest["engine_file"]).read_bytes()

        again = Server("s3://engines/store", bed.mlp_key, bed.tmp, bed.gpu_file, cache=cache)
        try:
            again.wait()
            assert '"fetched_bytes": 0' in again.output()
        finally:
            again.stop()
    finally:
        moto.stop()


def test_sigterm_drains_in_flight_requests(bed: Bed) -> None:
    s = Server(bed.store, bed.resnet_key, bed.tmp, bed.gpu_file, "--instances", "1")
    s.wait()
    x = np.zeros((1, 3, 224, 224), np.float32)
    results: list[object] = []

    async def infer_once() -> None:
        c = aioclient.InferenceServerClient(s.url, conn_timeout=30)
        inp = aioclient.InferInput(RESNET_IN, [1, 3, 224, 224], "FP32")
        inp.set_data_from_numpy(x)
        try:
            results.append((await c.infer("resnet50", [inp])).as_numpy(RESNET_OUT).shape)
        except Exception as e:
            results.append(e)
        finally:
            await c.close()

    def one() -> None:
        # tritonclient's asyncio client, one event loop per thread: its gevent-based sibling cannot
        # be closed, nor collected, outside the thread whose hub made it (an unraisable __del__ error).
        asyncio.run(infer_once())

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if metric_value(s.metrics(), 'trtforge_runtime_queue_depth{model="resnet50"}') == 3:
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the 4 requests never were in the server together")
    s.proc.send_signal(signal.SIGTERM)  # one executing, three queued: all four must still be answered
    for t in threads:
        t.join()
    assert s.exit_code(timeout=30) == 0
    s.stop()
    assert results == [(1, 1000)] * 4, results
    assert termination(s.term)["reason"] == "Completed"


def test_cli_refuses_a_malformed_key(bed: Bed) -> None:
    r = serve_once(bed.store, "abc", bed.gpu_file, bed.tmp / "t")
    assert r.returncode == 1 and "64 lowercase hex" in r.stderr
    shutil.rmtree(bed.tmp / "t", ignore_errors=True)


def _infer_concurrently(url: str, model: Path, xs: list[np.ndarray], clients: int) -> None:
    """`clients` tritonclient aio clients at once send the MLP inputs `xs` between them (client i
    every `clients`-th from the i-th); each answer is compared with ONNX Runtime run on `model`."""
    refs = [run_ort(model, {"x": x})["y"] for x in xs]

    async def client(i: int) -> None:
        c = aioclient.InferenceServerClient(url)
        try:
            for j in range(i, len(xs), clients):
                inp = aioclient.InferInput("x", list(xs[j].shape), "FP32")
                inp.set_data_from_numpy(xs[j])
                got = (await c.infer("mlp", [inp])).as_numpy("y")
                np.testing.assert_allclose(got, refs[j], rtol=1e-5, atol=1e-6)
        finally:
            await c.close()

    async def main() -> None:
        await asyncio.gather(*(client(i) for i in range(clients)))

    asyncio.run(main())


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a solo instance needs 2 or more CPUs")
def test_lone_requests_get_every_core_and_overlapping_ones_the_pool(bed: Bed) -> None:
    s = Server(
        bed.store, bed.mlp_key, bed.tmp, bed.gpu_file, "--instances", "2", "--max-queue-delay-us", "1000"
    )
    try:
        s.wait()
        # The solo instance loads after ready, never delaying it; start-up ends after it.
        events = _wait_for_log(s, "start-up done; garbage collection on")
        messages = [e.get("msg") for e in events]
        assert "solo instance ready" in messages, s.output()
        assert messages.index("ready") < messages.index("solo instance ready"), messages
        assert messages.index("solo instance ready") < messages.index(
            "start-up done; garbage collection on"
        ), messages
        _collector_resumed(events)
        rng = np.random.default_rng(9)
        c = httpclient.InferenceServerClient(s.url)
        for _ in range(5):  # one at a time: each finds nothing else to do and gets the solo session
            x = rng.standard_normal((2, 64)).astype(np.float32)
            inp = httpclient.InferInput("x", [2, 64], "FP32")
            inp.set_data_from_numpy(x)
            got = c.infer("mlp", [inp]).as_numpy("y")
            np.testing.assert_allclose(got, run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)
        m = s.metrics()
        assert metric_in(m, 'trtforge_runtime_solo_batches_total{model="mlp"}') == 5
        assert metric_in(m, 'trtforge_runtime_batch_size_count{model="mlp"}') == 5

        xs = [rng.standard_normal((1, 64)).astype(np.float32) for _ in range(256)]
        _infer_concurrently(s.url, bed.mlp, xs, 32)
        m = s.metrics()
        solo = metric_in(m, 'trtforge_runtime_solo_batches_total{model="mlp"}')
        batches = metric_in(m, 'trtforge_runtime_batch_size_count{model="mlp"}')
        assert batches - solo > 0, "32 concurrent clients never used the pool's instances"
    finally:
        s.stop()


def _listening(s: Server) -> dict[str, object]:
    (event,) = [e for e in _wait_for_log(s, "listening") if e.get("msg") == "listening"]
    return event


def test_the_gil_switch_interval_is_the_runtimes_default_or_the_flags(bed: Bed, mlp_server: Server) -> None:
    # Instance threads need the GIL after every batch; the runtime shortens Python's 5 ms wait.
    assert _listening(mlp_server)["gil_switch_interval_us"] == 500
    s = Server(bed.store, bed.mlp_key, bed.tmp, bed.gpu_file, "--gil-switch-interval-us", "2000")
    try:
        s.wait()
        assert _listening(s)["gil_switch_interval_us"] == 2000
    finally:
        assert s.stop() == 0
    r = serve_once(
        bed.store, bed.mlp_key, bed.gpu_file, bed.tmp / "t-switch", "--gil-switch-interval-us", "0"
    )
    assert r.returncode == 2 and "--gil-switch-interval-us" in r.stderr and "must be at least 1" in r.stderr


def _batch_cap_after_load(s: Server, model: Path) -> tuple[int, float, list[dict[str, object]]]:
    """The engine's max batch, the batch-cap gauge and the `batch cap` log lines once 64 clients have
    sent 256 requests (answers checked)."""
    rng = np.random.default_rng(7)
    _infer_concurrently(
        s.url, model, [rng.standard_normal((1, 64)).astype(np.float32) for _ in range(256)], 64
    )
    with urllib.request.urlopen(f"http://{s.url}/v2/models/mlp/config") as r:
        max_batch = int(json.load(r)["max_batch_size"])
    metrics = s.metrics()
    gauge = metric_in(metrics, 'trtforge_runtime_batch_cap{model="mlp"}')
    changes = [e for e in _wait_for_log(s, "listening") if e.get("msg") == "batch cap"]
    return max_batch, gauge, changes


def _ready(s: Server) -> list[dict[str, object]]:
    return [e for e in _wait_for_log(s, "ready") if e.get("msg") == "ready"]


def test_the_pool_learns_its_batch_cap_and_says_so_unless_told_not_to(bed: Bed) -> None:
    # The max batch is a ceiling: the pool caps where bigger batches stop computing rows faster, and
    # shows it on /metrics and in the log; --no-learned-batch-cap keeps the max batch.
    learned = Server(bed.store, bed.mlp_key, bed.tmp, bed.gpu_file, cache=bed.tmp / "t-cap")
    fixed = Server(
        bed.store, bed.mlp_key, bed.tmp, bed.gpu_file, "--no-learned-batch-cap", cache=bed.tmp / "t-nocap"
    )
    try:
        learned.wait()
        fixed.wait()
        assert [e["batch_cap"] for s in (learned, fixed) for e in _ready(s)] == ["learned", "max"]
        max_batch, gauge, changes = _batch_cap_after_load(learned, bed.mlp)
        assert max_batch > 1 and 1 <= gauge <= max_batch
        for e in changes:
            assert e["max_batch"] == max_batch and 1 <= int(str(e["limit"])) <= max_batch, e
            assert e["per_row_ms"] and int(str(e["changes"])) >= 1, e
        assert _batch_cap_after_load(fixed, bed.mlp) == (max_batch, max_batch, [])
    finally:
        learned.stop()
        fixed.stop()
