"""A hostile client of ``trtforge serve``, shared by the fuzz tests and the liveness benchmark.

:func:`hostile_requests` is the catalogue of bad bodies (60 MB of every shape, bombs, corrupt
encodings) for a model with one FP32 input; :func:`post` sends one; :class:`LiveProbe` polls
``/v2/health/live`` from a process of its own, as a kubelet would; :func:`rss_kb` reads a process's
memory. What each request must get back is the caller's to say: the tests assert it, the benchmark
records it.
"""

from __future__ import annotations

import gzip
import http.client
import json
import math
import subprocess
import sys
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MB = 1 << 20


@dataclass(frozen=True)
class HostileRequest:
    what: str  # a stable name: callers key their expectations on it
    body: bytes | Iterable[bytes]  # an iterable is sent chunked
    headers: dict[str, str] = field(default_factory=dict)


def binary_body(name: str, datatype: str, shape: Sequence[int], blob: bytes) -> tuple[bytes, dict[str, str]]:
    """A v2 binary-extension body: the JSON header, then `blob` as the input's data."""
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": datatype,
                    "shape": list(shape),
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    return head + blob, {"Inference-Header-Content-Length": str(len(head))}


def json_body(name: str, x: np.ndarray) -> bytes:
    """A v2 JSON body for one FP32 input."""
    return json.dumps(
        {"inputs": [{"name": name, "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    ).encode()


def chunks(data: bytes, size: int = MB) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def gzip_bomb(megabytes: int) -> bytes:
    """A gzip stream of `megabytes` MiB of zeros (a few hundred KiB on the wire)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MB)
    return b"".join([*(c.compress(zeros) for _ in range(megabytes)), c.flush()])


def hostile_requests(input_name: str, row_shape: Sequence[int]) -> Iterator[HostileRequest]:
    """The catalogue, for a model whose one FP32 input is ``[batch, *row_shape]``; bodies of 60 MB
    unless the name says otherwise."""
    n = 60 * MB
    row = list(row_shape)
    row_bytes = 4 * math.prod(row)
    zeros = bytes(n)
    body, h = binary_body(input_name, "FP32", [1, *row], zeros)
    yield HostileRequest("60 MB of FP32 for a one-row tensor", body, h)
    body, h = binary_body(input_name, "FP32", [n // row_bytes, *row], zeros)
    yield HostileRequest("60 MB FP32 declared as its true shape", body, h)
    body, h = binary_body(input_name, "BYTES", [n // 4], zeros)
    yield HostileRequest("15 M empty BYTES elements", body, h)
    body, h = binary_body(input_name, "FP32", [1, *row], zeros[:row_bytes])
    yield HostileRequest("60 MB of unclaimed binary data", body + zeros, h)
    head = json.dumps({"name": input_name, "datatype": "FP32", "shape": [1, *row]})[:-1].encode()
    json_zeros = b'{"inputs": [' + head + b', "data": [' + b"0," * (n // 2)
    yield HostileRequest("60 MB of JSON numbers", json_zeros + b"0]}]}")
    yield HostileRequest("60 MB of nested JSON arrays", b"[" * n)
    yield HostileRequest("60 MB JSON header length", zeros, {"Inference-Header-Content-Length": str(n)})
    yield HostileRequest("60 MB of random bytes", np.random.default_rng(0).bytes(n))
    yield HostileRequest("60 MB chunked", chunks(json_zeros))
    yield HostileRequest("70 MB chunked", chunks(bytes(70 * MB)))
    yield HostileRequest("70 MB Content-Length", bytes(70 * MB))
    yield HostileRequest("gzip bomb (256 MB of zeros)", gzip_bomb(256), {"Content-Encoding": "gzip"})
    yield HostileRequest("corrupt gzip", b"\x1f\x8b\x08\x00" + zeros[:MB], {"Content-Encoding": "gzip"})
    small = json_body(input_name, np.zeros((2, *row), np.float32))
    yield HostileRequest("truncated gzip", gzip.compress(small)[:-30], {"Content-Encoding": "gzip"})
    yield HostileRequest("corrupt deflate", b"\xff" * 1000, {"Content-Encoding": "deflate"})
    yield HostileRequest("brotli", b"\x0b" * 100, {"Content-Encoding": "br"})
    yield HostileRequest("bad header length", b"{}", {"Inference-Header-Content-Length": "x"})


def post(
    address: str,
    body: bytes | Iterable[bytes],
    headers: dict[str, str] | None = None,
    path: str = "/v2/models/model/infer",
    timeout: float = 120.0,
) -> tuple[int, str]:
    """POST raw bytes to ``host:port`` (an iterable is sent chunked); the status and the error text."""
    conn = http.client.HTTPConnection(address, timeout=timeout)
    try:
        conn.request(
            "POST", path, body=body, headers=headers or {}, encode_chunked=not isinstance(body, bytes)
        )
        r = conn.getresponse()
        data = r.read()
        try:
            error = str(json.loads(data).get("error", "")) if data else ""
        except ValueError:
            error = data[:200].decode(errors="replace")
        return r.status, error
    finally:
        conn.close()


_PROBE = """
import sys, time, urllib.request
url, out, period = sys.argv[1], open(sys.argv[2], "w", buffering=1), float(sys.argv[3])
while True:
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            status = str(r.status)
    except Exception as e:
        status = type(e).__name__
    out.write(f"{time.time():.3f} {status} {time.perf_counter() - t0:.6f}\\n")
    time.sleep(period)
"""


class LiveProbe:
    """Polls ``/v2/health/live`` on a fresh connection every `period` seconds from a process of its own
    (so the caller's work never delays it); `cpus` pins that process (``taskset -c``)."""

    def __init__(self, address: str, out: Path, period: float = 0.02, cpus: str | None = None) -> None:
        self.address, self.out, self.period, self.cpus = address, out, period, cpus
        self.times: list[float] = []
        self.statuses: list[str] = []
        self.latencies: list[float] = []

    def __enter__(self) -> LiveProbe:
        cmd = [
            sys.executable,
            "-c",
            _PROBE,
            f"http://{self.address}/v2/health/live",
            str(self.out),
            str(self.period),
        ]
        self._proc = subprocess.Popen(["taskset", "-c", self.cpus, *cmd] if self.cpus else cmd)
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.terminate()
        self._proc.wait()
        for line in self.out.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                self.times.append(float(parts[0]))
                self.statuses.append(parts[1])
                self.latencies.append(float(parts[2]))

    def percentile(self, q: float) -> float:
        """The `q` quantile (0..1) of the probe latencies, in seconds (nearest rank)."""
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))]

    def report(self) -> str:
        return (
            f"{len(self.latencies)} liveness probes: p50 {self.percentile(0.5) * 1e3:.1f} ms, "
            f"p99 {self.percentile(0.99) * 1e3:.1f} ms, max {max(self.latencies) * 1e3:.1f} ms"
        )


def rss_kb(pid: int, field_name: str = "VmRSS") -> int:
    """A field of /proc/<pid>/status in KiB (VmRSS now, VmHWM the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(f"{field_name} not in /proc/{pid}/status")
