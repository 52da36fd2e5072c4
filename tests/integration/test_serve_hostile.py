"""Hostile requests against a real `trtforge serve` (issue 12): each is refused with a clear message,
a valid request right after it succeeds (answers compared with ONNX Runtime run directly),
`/v2/health/live` answers throughout, and the server's peak RSS stays within 300 MB of idle.

The liveness latency is measured and reported (test output and the junit `record_property`), not
asserted: this machine is shared; docs/benchmarks.md has the timing.
"""

from __future__ import annotations

import gzip
import http.client
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.integration.serve_engines import build_engine, run_ort, write_gpu_file
from tests.integration.serve_process import Server
from tests.modelzoo import dynamic_mlp

pytestmark = pytest.mark.integration

MB = 1 << 20
RSS_BOUND_MB = 300


@dataclass
class Bed:
    tmp: Path
    store: Path
    gpu_file: Path
    mlp: Path
    key: str


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Bed:
    tmp = tmp_path_factory.mktemp("hostile")
    store = tmp / "store"
    gpu_file = write_gpu_file(tmp / "gpus.json")
    mlp = dynamic_mlp(seed=2, features=64, hidden=128, outputs=10)
    key = build_engine(store, mlp, name="mlp", gpu_file=gpu_file, samples=4, profiles=["x:1x64:16x64:32x64"])
    return Bed(tmp, store, gpu_file, mlp, key)


def _valid(bed: Bed, server: Server, seed: int) -> None:
    """A valid request succeeds and matches ONNX Runtime."""
    x = np.random.default_rng(seed).standard_normal((3, 64)).astype(np.float32)
    c = httpclient.InferenceServerClient(server.url, network_timeout=60)
    inp = httpclient.InferInput("x", [3, 64], "FP32")
    inp.set_data_from_numpy(x)
    got = c.infer("mlp", [inp]).as_numpy("y")
    np.testing.assert_allclose(got, run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)


_PROBE = """
import sys, time, urllib.request
url, out = sys.argv[1], open(sys.argv[2], "w", buffering=1)
while True:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            status = str(r.status)
    except Exception as e:
        status = type(e).__name__
    out.write(f"{status} {time.perf_counter() - t0:.6f}\\n")
    time.sleep(0.02)
"""


class LiveProbe:
    """Polls /v2/health/live on a fresh connection every 20 ms, as a kubelet would, from a process of
    its own (so the test's own work never delays it)."""

    def __init__(self, url: str, out: Path) -> None:
        self.url, self.out = url, out
        self.statuses: list[str] = []
        self.latencies: list[float] = []

    def __enter__(self) -> LiveProbe:
        target = f"http://{self.url}/v2/health/live"
        self._proc = subprocess.Popen([sys.executable, "-c", _PROBE, target, str(self.out)])
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait()
        for line in self.out.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2:
                self.statuses.append(parts[0])
                self.latencies.append(float(parts[1]))

    def report(self) -> str:
        lat = sorted(self.latencies)
        return (
            f"{len(lat)} liveness probes: p50 {lat[len(lat) // 2] * 1e3:.1f} ms, "
            f"p99 {lat[int(len(lat) * 0.99)] * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms"
        )


def _rss_kb(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field_name} not in /proc/{pid}/status")


def _post(
    server: Server,
    body: bytes | Iterable[bytes],
    headers: dict[str, str] | None = None,
    path: str = "/v2/models/mlp/infer",
) -> tuple[int, str]:
    """POST raw bytes (an iterable is sent chunked); the status and the error message."""
    conn = http.client.HTTPConnection(server.url, timeout=120)
    try:
        conn.request(
            "POST", path, body=body, headers=headers or {}, encode_chunked=not isinstance(body, bytes)
        )
        r = conn.getresponse()
        data = r.read()
        return r.status, str(json.loads(data).get("error", "")) if data else ""
    finally:
        conn.close()


def _binary_body(name: str, datatype: str, shape: list[int], blob: bytes) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": datatype,
                    "shape": shape,
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


def _json_body(x: np.ndarray) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    ).encode()


def _chunks(data: bytes, size: int = MB) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _gzip_bomb(megabytes: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MB)
    return b"".join([*(c.compress(zeros) for _ in range(megabytes)), c.flush()])


def _hostile_bodies() -> Iterator[tuple[str, bytes | Iterable[bytes], dict[str, str], int, str]]:
    """(what, body, headers, expected status, expected message part); bodies of 60 MB unless said."""
    n = 60 * MB
    zeros = bytes(n)
    body, h = _binary_body("x", "FP32", [1, 64], zeros)
    yield "60 MB of FP32 for a [1, 64] tensor", body, h, 400, "needs 256"
    body, h = _binary_body("x", "FP32", [n // 256, 64], zeros)
    yield "60 MB FP32 declared as its true shape", body, h, 400, "exceeds the model's max batch size 32"
    body, h = _binary_body("x", "BYTES", [n // 4], zeros)
    yield "15 M empty BYTES elements", body, h, 400, "datatype BYTES, expected FP32"
    body, h = _binary_body("x", "FP32", [1, 64], zeros[:256])
    yield "60 MB of unclaimed binary data", body + zeros, h, 400, "not claimed by any input"
    json_zeros = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 64], "data": [' + b"0," * (
        n // 2
    )
    yield "60 MB of JSON numbers", json_zeros + b"0]}]}", {}, 413, "bytes of JSON"
    yield "60 MB of nested JSON arrays", b"[" * n, {}, 413, "bytes of JSON"
    yield "60 MB JSON header length", zeros, {"Inference-Header-Content-Length": str(n)}, 413, "bytes of JSON"
    yield "60 MB of random bytes", np.random.default_rng(0).bytes(n), {}, 413, "bytes of JSON"
    yield "60 MB chunked", _chunks(json_zeros), {}, 413, "bytes of JSON"
    yield "70 MB chunked", _chunks(bytes(70 * MB)), {}, 413, "exceeds the limit of 67108864 bytes"
    yield "70 MB Content-Length", bytes(70 * MB), {}, 413, "73400320 bytes exceeds the limit"
    yield "gzip bomb (256 MB of zeros)", _gzip_bomb(256), {"Content-Encoding": "gzip"}, 413, "decompressed"
    yield (
        "corrupt gzip",
        b"\x1f\x8b\x08\x00" + zeros[:MB],
        {"Content-Encoding": "gzip"},
        400,
        "not valid gzip",
    )
    trunc = gzip.compress(_json_body(np.zeros((2, 64), np.float32)))[:-30]
    yield "truncated gzip", trunc, {"Content-Encoding": "gzip"}, 400, "truncated"
    yield "corrupt deflate", b"\xff" * 1000, {"Content-Encoding": "deflate"}, 400, "not valid deflate"
    yield "brotli", b"\x0b" * 100, {"Content-Encoding": "br"}, 415, "not supported"
    yield "bad header length", b"{}", {"Inference-Header-Content-Length": "x"}, 400, "not an integer"


def test_hostile_bodies_are_refused_and_leave_the_server_healthy(
    bed: Bed, record_property: pytest.RecordProperty
) -> None:
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file)
    try:
        s.wait()
        _valid(bed, s, 0)
        idle_kb = _rss_kb(s.proc.pid, "VmRSS")
        with LiveProbe(s.url, bed.tmp / f"probe-{s.port}") as probe:
            for i, (what, body, headers, status, message) in enumerate(_hostile_bodies()):
                got, error = _post(s, body, headers)
                assert (got, message in error) == (status, True), f"{what}: {got} {error!r}"
                _valid(bed, s, i + 1)
            # Four at once.
            body, h = _binary_body("x", "FP32", [1, 64], bytes(60 * MB))
            results: list[tuple[int, str]] = []
            threads = [threading.Thread(target=lambda: results.append(_post(s, body, h))) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert [r[0] for r in results] == [400] * 4, results
            _valid(bed, s, 99)
            # Valid compressed requests are decoded once and answered.
            x = np.random.default_rng(7).standard_normal((2, 64)).astype(np.float32)
            ref = run_ort(bed.mlp, {"x": x})["y"]
            for coding, data in (
                ("gzip", gzip.compress(_json_body(x))),
                ("deflate", zlib.compress(_json_body(x))),
            ):
                conn = http.client.HTTPConnection(s.url, timeout=60)
                conn.request("POST", "/v2/models/mlp/infer", body=data, headers={"Content-Encoding": coding})
                r = conn.getresponse()
                assert r.status == 200, (coding, r.read())
                out = json.loads(r.read())["outputs"][0]
                np.testing.assert_allclose(np.array(out["data"]).reshape(2, 10), ref, rtol=1e-5, atol=1e-6)
                conn.close()
        peak_mb = (_rss_kb(s.proc.pid, "VmHWM") - idle_kb) / 1024
        assert s.proc.poll() is None
    finally:
        s.stop()
    print(f"\npeak RSS {peak_mb:.0f} MB above idle; {probe.report()}")
    record_property("peak_rss_above_idle_mb", round(peak_mb))
    record_property("liveness", probe.report())
    bad = [st for st in probe.statuses if st != "200"]
    assert not bad and len(probe.statuses) > 10, bad
    assert peak_mb <= RSS_BOUND_MB


def _metric(server: Server, name: str) -> float:
    text = urllib.request.urlopen(f"http://{server.url}/metrics", timeout=30).read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def _open(server: Server, first: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    if first:
        sock.sendall(first)
    return sock


def test_half_open_connections_are_closed_after_the_idle_timeout(bed: Bed) -> None:
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file, "--idle-timeout", "2")
    socks: list[socket.socket] = []
    try:
        s.wait()
        with LiveProbe(s.url, bed.tmp / f"probe-{s.port}") as probe:
            partial = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Le"
            socks = [_open(s, b"" if i % 2 else partial) for i in range(500)]
            _valid(bed, s, 1)  # served while 500 connections sit open
            assert _metric(s, "trtforge_runtime_open_connections") >= 500
            for sock in socks:  # the server closes each one: EOF, with no request ever answered
                sock.settimeout(120)
                assert sock.recv(1024) == b""
            _valid(bed, s, 2)
        assert probe.statuses and all(st == "200" for st in probe.statuses), probe.statuses
        assert _metric(s, "trtforge_runtime_open_connections") < 10  # the probes' and this scrape's
    finally:
        for sock in socks:
            sock.close()
        s.stop()


def test_connections_past_the_cap_get_health_answers_and_503(bed: Bed) -> None:
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file, "--max-connections", "20")
    socks: list[socket.socket] = []
    try:
        s.wait()
        socks = [_open(s, b"") for _ in range(20)]
        time.sleep(0.2)  # let the server accept them (the cap counts accepted connections)
        assert s.get("/v2/health/live") == (200, {"live": True})
        assert s.get("/v2/health/ready") == (200, {"ready": True})
        status, error = _post(s, b"{}")
        assert status == 503 and "20 open connections, its limit" in error
    finally:
        for sock in socks:
            sock.close()
    try:
        deadline = time.monotonic() + 60
        while True:  # the closed connections leave the server's count as it notices them
            try:
                _valid(bed, s, 3)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert _metric(s, "trtforge_runtime_connections_refused_total") >= 3
    finally:
        s.stop()
