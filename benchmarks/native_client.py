"""The load generator's native client: ``benchmarks/native/v2load.c``, built here with ``cc``.

On this 2-core machine the client shares the cores with the server it measures, so what the client
costs is taken from the server: the Python HTTP client (``loadgen._HttpConnection``) spent 3.5 to
6.5% of the two cores at SqueezeNet HTTP c=8, about half of it its own Python (docs/benchmarks.md
§1d), and the gRPC one more. The native client sends the same bytes (built here, by the Python
code), keeps the same closed loop and checks every answer the same way: over HTTP the binary
output (what a v2 binary request asks for), over gRPC the ModelInferResponse's output. It does not
decode HTTP/2 header blocks, so a gRPC call that fails is an error without its status. Its cost is
its system calls.

The binary is built once per version of the source, into ``.cache/native/`` (compiled to a temporary
name, then renamed, so a half-written binary is never run).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from benchmarks.loadgen import Check, _Window

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path(__file__).resolve().parent / "native" / "v2load.c"
BUILD = ROOT / ".cache" / "native"
CFLAGS = ("-O2", "-Wall", "-Wextra")


class NativeClientError(RuntimeError):
    """The native client could not be built or did not run to its end."""


def binary() -> Path:
    """The built client for the current source, built now if it is not there yet."""
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:16]
    out = BUILD / f"v2load-{digest}"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise NativeClientError(
            "the native load generator needs a C compiler: install gcc (`make deps` does) or set CC,"
            " or pass --client python"
        )
    BUILD.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    done = subprocess.run([cc, *CFLAGS, "-o", str(tmp), str(SOURCE), "-lm"], capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise NativeClientError(f"{cc} could not build {SOURCE.name}:\n{done.stderr.strip()}")
    os.replace(tmp, out)
    return out


def run_native(
    protocol: str,
    target: str,
    request: bytes,
    c: int,
    seconds: float,
    warmup: float,
    cap: int,
    check: Check | None,
    headers_block: bytes = b"",
) -> _Window:
    """`c` closed-loop workers sending `request` to `target` (host:port) in the native client, as
    ``loadgen._run_http`` and ``loadgen._run_grpc`` do; its window. `protocol` "http": `request` is
    a whole HTTP/1.1 request; "grpc": a ModelInfer message with its gRPC prefix, sent after
    `headers_block` (its HPACK block, ``h2client.request_block``)."""
    from benchmarks.loadgen import _Window, stream_rate

    host, _, port = target.rpartition(":")
    host = "127.0.0.1" if host == "localhost" else host
    with tempfile.TemporaryDirectory(prefix="v2load-") as d:
        req = Path(d) / "request"
        req.write_bytes(request)
        argv = [str(binary()), "--protocol", protocol, "--host", host, "--port", port, "--request", str(req)]
        if protocol == "grpc":
            block = Path(d) / "headers-block"
            block.write_bytes(headers_block)
            argv += ["--headers-block", str(block)]
        argv += ["--concurrency", str(c), "--seconds", repr(seconds), "--warmup", repr(warmup)]
        argv += ["--max-requests", str(cap)]
        if check is not None:
            ref = Path(d) / "reference"
            ref.write_bytes(np.ascontiguousarray(check.reference, dtype="<f4").tobytes())
            argv += ["--reference", str(ref), "--atol", repr(check.atol), "--output", check.output]
        done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise NativeClientError(f"the native client exited with {done.returncode}: {done.stderr.strip()}")
    out = json.loads(done.stdout)
    window = float(out["window"])
    streams = [(int(n), float(first), float(last)) for n, first, last, _ in out["streams"]]
    return _Window(
        latencies=[v / 1e3 for v in out["latencies_ms"]],
        errors=int(out["errors"]),
        error_samples=list(out["error_samples"]),
        window=window,
        cpu_s=float(out["cpu_s"]),
        per_stream=[n for n, _, _ in streams],
        rate=sum(stream_rate(n, first, last, window) for n, first, last in streams),
        shares=sum(float(shares) for *_, shares in out["streams"]),
    )
