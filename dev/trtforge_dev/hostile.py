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
import io
import json
import math
import select
import socket
import struct
import subprocess
import sys
import threading
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
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


@cache
def gzip_bomb(mebibytes: int) -> bytes:
    """A valid gzip stream of `mebibytes` MiB of zeros, about a thousandth of that on the wire. One
    MiB is deflated once and ended with a full flush (no reference reaches back past it), so the
    stream is that segment repeated: made in well under a second, unlike deflating the whole."""
    zeros = bytes(MB)
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segment = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    end = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS).flush()  # an empty final block
    crc = 0
    for _ in range(mebibytes):
        crc = zlib.crc32(zeros, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    trailer = struct.pack("<II", crc, (mebibytes * MB) & 0xFFFFFFFF)
    return header + segment * mebibytes + end + trailer


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
    # cut short but ending in its true size, so that the trailer's size check passes and inflating
    # meets the cut (a cut body ending anywhere else is refused by that check instead: 413)
    gz = gzip.compress(small)
    yield HostileRequest("truncated gzip", gz[:-30] + gz[-4:], {"Content-Encoding": "gzip"})
    yield HostileRequest("corrupt deflate", b"\xff" * 1000, {"Content-Encoding": "deflate"})
    yield HostileRequest("brotli", b"\x0b" * 100, {"Content-Encoding": "br"})
    yield HostileRequest("bad header length", b"{}", {"Inference-Header-Content-Length": "x"})


def post(
    address: str,
    body: bytes | Iterable[bytes],
    headers: dict[str, str] | None = None,
    path: str = "/v2/models/model/infer",
    timeout: float = 120.0,
    source: str | None = None,
) -> tuple[int, str]:
    """POST raw bytes to ``host:port`` (an iterable is sent chunked) from `source` (an address, or the
    system's choice); the status and the error text."""
    conn = http.client.HTTPConnection(
        address, timeout=timeout, source_address=(source, 0) if source else None
    )
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


# --- HTTP/1.1 attackers -----------------------------------------------------------------------------
# Each is ``attack(target, stop, counters)`` like the HTTP/2 ones of :mod:`trtforge_dev.hostile_h2`:
# it attacks the HTTP port until `stop` is set, counting what it did and what came back. They write
# raw bytes to a socket because every HTTP client library refuses to send these requests.


@dataclass(frozen=True)
class Target:
    """Where to attack and what a legitimate request of the served model looks like."""

    host: str
    grpc_port: int
    http_port: int
    model: str
    input_name: str
    # A valid FP32 input of the model, batch included. Small: the HTTP/2 attackers send its request
    # in one DATA frame (16 KiB at most) without waiting for flow-control credit.
    sample: np.ndarray
    # The attackers' own source address (another loopback address, so a front proxy's per-client
    # limits tell them from the legitimate clients); None: the system's choice.
    source: str | None = None

    def connect(self, port: int, timeout: float) -> socket.socket:
        """A TCP connection to `port` from the attackers' source address."""
        return socket.create_connection(
            (self.host, port), timeout=timeout, source_address=(self.source, 0) if self.source else None
        )


class _Unclosed(io.BytesIO):
    def close(self) -> None:  # HTTPResponse closes its file after each response; the next reads on
        pass


class _Replayed:
    """What :class:`http.client.HTTPResponse` reads from: bytes already received."""

    def __init__(self, data: bytes) -> None:
        self.file = _Unclosed(data)

    def makefile(self, mode: str) -> io.BytesIO:
        return self.file


def parse_responses(data: bytes) -> list[int]:
    """The statuses of the HTTP/1.1 responses in `data`, in order (http.client's parser); a
    trailing partial response is left out."""
    src = _Replayed(data)
    statuses: list[int] = []
    while data.find(b"\r\n\r\n", src.file.tell()) != -1:  # a whole head is there
        r = http.client.HTTPResponse(src)  # type: ignore[arg-type]
        try:
            r.begin()
            r.read()
        except (http.client.HTTPException, ValueError):
            break
        statuses.append(r.status)
    return statuses


def exchange(target: Target, raw: bytes, quiet: float = 2.0) -> tuple[list[int], bool]:
    """Write `raw` on a new connection and read until the server closes it or stays silent for
    `quiet` seconds: the statuses answered, and whether the server closed the connection."""
    with target.connect(target.http_port, quiet) as s:
        s.sendall(raw)
        got = bytearray()
        closed = False
        while True:
            try:
                data = s.recv(1 << 16)
            except TimeoutError:
                break
            except OSError:
                closed = True
                break
            if not data:
                closed = True
                break
            got += data
    return parse_responses(bytes(got)), closed


def _infer_head(target: Target, *headers: str) -> bytes:
    lines = [f"POST /v2/models/{target.model}/infer HTTP/1.1", f"Host: {target.host}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _exchanges(
    target: Target, stop: threading.Event, counters: Counter[str], raw: bytes, expected: int
) -> None:
    """Send `raw` on one connection after another; count the answers: `extra_responses` are those
    past the `expected` number (a request the server should not have parsed), `left_open` the
    connections the server kept after answering."""
    while not stop.is_set():
        try:
            statuses, closed = exchange(target, raw)
        except OSError:
            counters["connect_failed"] += 1
            stop.wait(0.05)
            continue
        counters["connections"] += 1
        counters[f"answers_{'_'.join(map(str, statuses)) or 'none'}"] += 1
        counters["extra_responses"] += max(0, len(statuses) - expected)
        counters["left_open"] += not closed


def _smuggled(target: Target) -> bytes:
    return f"GET /v2/models/{target.model}/config HTTP/1.1\r\nHost: {target.host}\r\n\r\n".encode()


def cl_with_te(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """A request with both Content-Length and ``Transfer-Encoding: chunked`` whose chunked body ends
    at once and is followed by a second request (the CL.TE/TE.CL smuggling shape): one answer, then
    the connection closed; a second answer is a smuggled request."""
    body = b"0\r\n\r\n" + _smuggled(target)
    raw = _infer_head(target, f"Content-Length: {len(body)}", "Transfer-Encoding: chunked") + body
    _exchanges(target, stop, counters, raw, expected=1)


def two_content_lengths(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """A request with two different Content-Lengths whose shorter one ends the body before a second
    request: one answer (400), then the connection closed."""
    smuggled = _smuggled(target)
    raw = _infer_head(target, "Content-Length: 2", f"Content-Length: {2 + len(smuggled)}") + b"{}" + smuggled
    _exchanges(target, stop, counters, raw, expected=1)


def pipelined_malformed(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """Three pipelined requests in one write: a good health check, one with a header line without a
    colon, then a good one. The first is answered (200), the malformed one refused (400) and the
    connection closed: the third is never read as a request of its own."""
    ready = f"GET /v2/health/ready HTTP/1.1\r\nHost: {target.host}\r\n\r\n".encode()
    bad = f"GET /v2/health/ready HTTP/1.1\r\nHost: {target.host}\r\nBad header line\r\n\r\n".encode()
    _exchanges(target, stop, counters, ready + bad + ready, expected=2)


def slowloris(target: Target, stop: threading.Event, counters: Counter[str], connections: int = 200) -> None:
    """`connections` connections that send a request head one byte at a time (one byte to each every
    0.2 s) and never finish it; each one the server closes is replaced by a new one."""
    prefix = f"POST /v2/models/{target.model}/infer HTTP/1.1\r\nHost: {target.host}\r\n".encode()
    line = b"X-Slow: " + b"s" * 40 + b"\r\n"  # header lines without end: the head never completes

    def byte(i: int) -> bytes:
        return prefix[i : i + 1] if i < len(prefix) else line[(i - len(prefix)) % len(line)].to_bytes()

    socks: dict[int, tuple[socket.socket, int]] = {}  # by fd: each socket and how much it has sent
    poller = select.poll()

    def open_one() -> bool:
        try:
            s = target.connect(target.http_port, 5)
        except OSError:
            counters["connect_failed"] += 1
            return False
        s.setblocking(False)
        socks[s.fileno()] = (s, 0)
        poller.register(s, select.POLLIN)
        counters["opened"] += 1
        return True

    def drop(fd: int, counter: str) -> None:
        counters[counter] += 1
        s, _ = socks.pop(fd)
        poller.unregister(s)
        s.close()

    try:
        while not stop.is_set():
            while len(socks) < connections and not stop.is_set() and open_one():
                pass
            for fd, _ in poller.poll(0):  # the server answered or closed: either ends this one
                try:
                    data = socks[fd][0].recv(1024)
                except OSError:
                    data = b""
                drop(fd, "closed_by_server" if not data else "answered")
            for fd, (s, sent) in list(socks.items()):
                try:
                    s.send(byte(sent))
                    socks[fd] = (s, sent + 1)
                    counters["head_bytes"] += 1
                except OSError:
                    drop(fd, "closed_by_server")
            stop.wait(0.2)
    finally:
        for s, _ in socks.values():
            s.close()


def slowloris_1100(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """:func:`slowloris` on 1,100 connections: more than the server's default --max-connections."""
    slowloris(target, stop, counters, connections=1100)


HTTP_BOMB_MIB = 128  # what http_gzip_bomb's body inflates to


def http_gzip_bomb(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    """A gzip body of `HTTP_BOMB_MIB` MiB of zeros (about 130 KB on the wire), posted again as soon as
    it is answered: ``answers_N`` per status, ``names_the_limit`` for refusals whose error says which
    limit."""
    body = gzip_bomb(HTTP_BOMB_MIB)
    while not stop.is_set():
        try:
            status, text = post(
                f"{target.host}:{target.http_port}",
                body,
                {"Content-Encoding": "gzip", "Content-Type": "application/json"},
                path=f"/v2/models/{target.model}/infer",
                timeout=30,
                source=target.source,
            )
        except OSError:
            counters["failed"] += 1
            stop.wait(0.05)
            continue
        counters[f"answers_{status}"] += 1
        counters["names_the_limit"] += "exceeds the limit of" in text


def _slow_bodies(target: Target, stop: threading.Event, counters: Counter[str], chunked: bool) -> None:
    """Four connections whose requests claim 64 MiB bodies (a Content-Length, or chunked with no length
    at all) and then send 64 bytes every 0.1 s."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {64 * MB}"
    piece = b"x" * 64
    drip = b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece
    socks: list[socket.socket] = []
    try:
        for _ in range(4):
            s = target.connect(target.http_port, 5)
            s.sendall(_infer_head(target, framing))
            socks.append(s)
        while not stop.wait(0.1):
            for s in list(socks):
                try:
                    s.sendall(drip)
                    counters["body_bytes"] += len(piece)
                except OSError:  # the server gave up on it (its body deadline)
                    counters["closed_by_server"] += 1
                    socks.remove(s)
        counters["still_sending"] = len(socks)
    finally:
        for s in socks:
            s.close()


def slow_body_plain(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    _slow_bodies(target, stop, counters, chunked=False)


def slow_body_chunked(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    _slow_bodies(target, stop, counters, chunked=True)


H1_ATTACKS: dict[str, Callable[[Target, threading.Event, Counter[str]], None]] = {
    "cl_with_te": cl_with_te,
    "two_content_lengths": two_content_lengths,
    "pipelined_malformed": pipelined_malformed,
    "slowloris": slowloris,
    "slowloris_1100": slowloris_1100,
    "http_gzip_bomb": http_gzip_bomb,
    "slow_body_plain": slow_body_plain,
    "slow_body_chunked": slow_body_chunked,
}
