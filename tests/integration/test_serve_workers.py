"""`trtforge serve --workers N`: N runtime processes on one port, each on its own CPUs, one pod's
metrics, one exit code. Real processes, real sockets, answers compared with ONNX Runtime."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from trtforge_dev.modelzoo import dynamic_mlp
from trtforge_dev.serve_engines import build_engine, run_ort, write_gpu_file

from tests.integration.serve_process import Server, metric_value, serve_once

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two workers need two CPUs"),
]


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split()
        out += [int(c) for c in children]
    return out


def _cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split()[1]
    raise AssertionError("no Cpus_allowed_list")


def _answered(s: Server) -> list[float]:
    """The requests each worker says it answered (its own `worker` series on the pod's /metrics)."""
    metrics = s.metrics()
    return [
        metric_value(metrics, f'trtforge_runtime_worker_requests_total{{model="mlp",worker="{i}"}}') or 0.0
        for i in (0, 1)
    ]


def _get_or_none(s: Server, path: str) -> tuple[int, dict[str, object]] | None:
    try:
        return s.get(path)
    except OSError:
        return None  # not listening yet


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, str]:
    tmp = tmp_path_factory.mktemp("workers")
    gpu_file = write_gpu_file(tmp / "gpus.json")
    mlp = dynamic_mlp(seed=4, features=64, hidden=128, outputs=10)
    key = build_engine(
        tmp / "store", mlp, name="mlp", gpu_file=gpu_file, samples=4, profiles=["x:1x64:16x64:32x64"]
    )
    return tmp, gpu_file, mlp, key


def test_two_workers_share_the_port_and_report_as_one_pod(engine: tuple[Path, Path, Path, str]) -> None:
    tmp, gpu_file, mlp, key = engine
    s = Server(tmp / "store", key, tmp, gpu_file, "--workers", "2")
    try:
        # Worker 1 starts once worker 0 is ready: meanwhile the pod is not Ready, and says why.
        deadline = time.monotonic() + 60
        while (got := _get_or_none(s, "/v2/health/ready")) != (
            503,
            {"ready": False, "error": "1 of 2 workers ready"},
        ):
            assert got is None or got[0] == 503, got  # never Ready with one worker
            assert time.monotonic() < deadline and s.proc.poll() is None, s.output()
            time.sleep(0.01)
        s.wait()
        # Ready only once every worker is ready and listens on both ports, so clients that connect
        # from now on spread over all of them.
        out = s.output()
        assert out.count('"msg": "ready"') == 2, out
        assert out.count('"msg": "listening"') == 2 and out.count('"msg": "listening for gRPC"') == 2, out
        assert grpcclient.InferenceServerClient(s.grpc_url).is_server_ready()
        workers = _children(s.proc.pid)
        assert len(workers) == 2
        assert _cpus(workers[0]) != _cpus(workers[1])  # each on its own CPUs
        assert _answered(s) == [0, 0]

        rng = np.random.default_rng(5)
        xs = [rng.standard_normal((2, 64)).astype(np.float32) for _ in range(160)]

        async def client(i: int) -> None:
            c = aioclient.InferenceServerClient(s.url)  # a connection of its own
            try:
                for j in range(i, len(xs), 16):
                    inp = aioclient.InferInput("x", [2, 64], "FP32")
                    inp.set_data_from_numpy(xs[j])
                    got = (await c.infer("mlp", [inp])).as_numpy("y")
                    np.testing.assert_allclose(got, run_ort(mlp, {"x": xs[j]})["y"], rtol=1e-5, atol=1e-6)
            finally:
                await c.close()

        async def one_more(x: np.ndarray) -> None:
            c = aioclient.InferenceServerClient(s.url)  # a new connection: the kernel picks its worker
            try:
                inp = aioclient.InferInput("x", [2, 64], "FP32")
                inp.set_data_from_numpy(x)
                got = (await c.infer("mlp", [inp])).as_numpy("y")
                np.testing.assert_allclose(got, run_ort(mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)
            finally:
                await c.close()

        async def main() -> int:
            await asyncio.gather(*(client(i) for i in range(16)))
            # Each connection lands on either worker with even odds, so sixteen all on one worker are
            # rare but possible: new connections until both have answered (each worker's own count).
            more = 0
            while 0 in _answered(s):
                assert more < 256, _answered(s)
                await one_more(xs[more % len(xs)])
                more += 1
            return more

        more = asyncio.run(main())
        g = grpcclient.InferenceServerClient(s.grpc_url)  # gRPC shares its port the same way
        inp = grpcclient.InferInput("x", [2, 64], "FP32")
        inp.set_data_from_numpy(xs[0])
        np.testing.assert_allclose(
            g.infer("mlp", [inp]).as_numpy("y"), run_ort(mlp, {"x": xs[0]})["y"], rtol=1e-5
        )
        g.close()
        # Both served, each by its own count; one pod's metrics, whichever worker answers the scrape.
        for _ in range(4):
            answered = _answered(s)
            assert all(n > 0 for n in answered) and sum(answered) == 161 + more, answered
            assert s.metric('trtforge_runtime_requests_total{model="mlp",outcome="success"}') == 161 + more
            assert s.metric('trtforge_runtime_ready{model="mlp"}') == 1
        s.proc.send_signal(signal.SIGTERM)
        assert s.exit_code(timeout=60) == 0
    finally:
        s.stop()


def test_a_worker_that_dies_ends_the_pod(engine: tuple[Path, Path, Path, str]) -> None:
    tmp, gpu_file, _, key = engine
    s = Server(tmp / "store", key, tmp, gpu_file, "--workers", "2")
    try:
        s.wait()
        deadline = time.monotonic() + 60
        while len(_children(s.proc.pid)) < 2:
            assert time.monotonic() < deadline, s.output()
            time.sleep(0.05)
        os.kill(_children(s.proc.pid)[1], signal.SIGKILL)
        assert s.exit_code(timeout=60) == 128 + signal.SIGKILL
        assert "a worker ended; stopping the others" in s.output()
    finally:
        s.stop()


def test_workers_refuse_port_zero_and_more_workers_than_cpus(engine: tuple[Path, Path, Path, str]) -> None:
    tmp, gpu_file, _, key = engine
    too_many = str(len(os.sched_getaffinity(0)) + 1)
    for extra, message in [
        (["--port", "0", "--workers", "2"], "give --port and --grpc-port numbers, not 0"),
        (
            ["--port", "18999", "--grpc-port", "18998", "--workers", too_many],
            f"{too_many} workers need at least",
        ),
    ]:
        r = serve_once(tmp / "store", key, gpu_file, tmp / "t", *extra)
        assert r.returncode == 2 and message in r.stderr + r.stdout, (r.stdout, r.stderr)


def test_workers_serve_on_uvloop_when_asked(engine: tuple[Path, Path, Path, str]) -> None:
    """`--event-loop uvloop`: every worker runs uvloop's loop and both protocols answer as ONNX Runtime."""
    tmp, gpu_file, mlp, key = engine
    s = Server(tmp / "store", key, tmp, gpu_file, "--workers", "2", "--event-loop", "uvloop")
    try:
        s.wait()
        listening = [json.loads(line) for line in s.output().splitlines() if '"msg": "listening"' in line]
        assert [entry["event_loop"] for entry in listening] == ["uvloop", "uvloop"], s.output()
        x = np.random.default_rng(6).standard_normal((3, 64)).astype(np.float32)
        want = run_ort(mlp, {"x": x})["y"]
        h = httpclient.InferenceServerClient(s.url)
        hin = httpclient.InferInput("x", [3, 64], "FP32")
        hin.set_data_from_numpy(x)
        np.testing.assert_allclose(h.infer("mlp", [hin]).as_numpy("y"), want, rtol=1e-5, atol=1e-6)
        g = grpcclient.InferenceServerClient(s.grpc_url)
        gin = grpcclient.InferInput("x", [3, 64], "FP32")
        gin.set_data_from_numpy(x)
        np.testing.assert_allclose(g.infer("mlp", [gin]).as_numpy("y"), want, rtol=1e-5, atol=1e-6)
        g.close()
        s.proc.send_signal(signal.SIGTERM)
        assert s.exit_code(timeout=60) == 0
    finally:
        s.stop()
