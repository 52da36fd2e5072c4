"""A closed-loop load generator for the Open Inference Protocol (v2) over HTTP, binary tensor data.

The same client drives every server: C connections, each sending its next request as soon as the
previous answer is read. Requests that finish inside the measuring window (after a warm-up) count;
the run is bounded by time and by a request cap, and only ever talks to the URL it is given (the
benchmarks pass 127.0.0.1).

Run as a program it prints one JSON object (so the serving benchmark can pin it to its own cores):
``python -m benchmarks.loadgen --url ... --model ... --input NAME --output NAME --concurrency 8``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

HEADER = "Inference-Header-Content-Length"


def v2_request(input_name: str, output_name: str, x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """Body and headers of a v2 request with the input as binary data and a binary output asked."""
    raw = np.ascontiguousarray(x, dtype=np.float32).tobytes()
    head = {
        "inputs": [
            {
                "name": input_name,
                "shape": list(x.shape),
                "datatype": "FP32",
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        "outputs": [{"name": output_name, "parameters": {"binary_data": True}}],
    }
    js = json.dumps(head, separators=(",", ":")).encode()
    headers = {HEADER: str(len(js)), "Content-Type": "application/octet-stream"}
    return js + raw, headers


def v2_decode(body: bytes, header_length: str | None, output_name: str) -> np.ndarray:
    """The named FP32 output of a v2 response (binary or JSON)."""
    n = int(header_length) if header_length else len(body)
    head = json.loads(body[:n])
    offset = n
    for out in head["outputs"]:
        size = (out.get("parameters") or {}).get("binary_data_size")
        if out["name"] == output_name:
            if size is not None:
                arr = np.frombuffer(body[offset : offset + size], dtype=np.float32)
            else:
                arr = np.asarray(out["data"], dtype=np.float32)
            return arr.reshape(out["shape"])
        if size is not None:
            offset += size
    raise KeyError(f"response has no output {output_name!r}: {[o['name'] for o in head['outputs']]}")


@dataclass
class LoadResult:
    concurrency: int
    seconds: float  # length of the measuring window
    completed: int  # requests answered 200 inside the window
    errors: int
    throughput: float  # completed / seconds
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    client_cpu_s: float  # the load generator's own CPU time inside the window
    error_samples: list[str] = field(default_factory=list)


def _pct(vals: list[float], q: float) -> float:
    return float(np.percentile(vals, q)) if vals else float("nan")


async def run_load(
    url: str,
    body: bytes,
    headers: dict[str, str],
    concurrency: int,
    seconds: float,
    warmup: float,
    max_requests: int = 200_000,
    timeout: float = 60.0,
) -> LoadResult:
    import aiohttp

    lat: list[float] = []
    errors: list[str] = []
    n_errors = 0
    sent = 0
    t_start = time.perf_counter()
    t_measure = t_start + warmup
    t_end = t_measure + seconds
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=False, enable_cleanup_closed=True)
    tmo = aiohttp.ClientTimeout(total=timeout)
    cpu0: float | None = None

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent, n_errors
        while sent < max_requests:
            t0 = time.perf_counter()
            if t0 >= t_end:
                return
            sent += 1
            try:
                async with session.post(url, data=body, headers=headers) as r:
                    await r.read()
                    ok = r.status == 200
                    status = r.status
            except (aiohttp.ClientError, TimeoutError) as e:
                ok, status = False, -1
                if len(errors) < 5:
                    errors.append(f"{type(e).__name__}: {e}")
            t1 = time.perf_counter()
            if t_measure <= t1 <= t_end:
                if ok:
                    lat.append(t1 - t0)
                else:
                    n_errors += 1
                    if status != -1 and len(errors) < 5:
                        errors.append(f"HTTP {status}")
            if not ok:
                await asyncio.sleep(0.01)  # a failing server is not hammered

    async def cpu_mark() -> None:
        nonlocal cpu0
        await asyncio.sleep(max(0.0, t_measure - time.perf_counter()))
        cpu0 = _cpu()

    async with aiohttp.ClientSession(connector=conn, timeout=tmo) as session:
        marker = asyncio.create_task(cpu_mark())
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        await marker
    cpu1 = _cpu()
    window = min(seconds, max(1e-9, time.perf_counter() - t_measure))
    lat.sort()
    ms = [v * 1000 for v in lat]
    return LoadResult(
        concurrency=concurrency,
        seconds=round(window, 3),
        completed=len(lat),
        errors=n_errors,
        throughput=round(len(lat) / window, 2),
        p50_ms=round(_pct(ms, 50), 2),
        p90_ms=round(_pct(ms, 90), 2),
        p99_ms=round(_pct(ms, 99), 2),
        mean_ms=round(float(np.mean(ms)), 2) if ms else float("nan"),
        max_ms=round(ms[-1], 2) if ms else float("nan"),
        client_cpu_s=round(cpu1 - (cpu0 if cpu0 is not None else cpu1), 3),
        error_samples=errors,
    )


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--max-requests", type=int, default=200_000)
    a = p.parse_args(argv)
    if not a.url.startswith(("http://127.", "http://localhost")):
        print("the load generator only targets loopback addresses", file=sys.stderr)
        return 2
    from benchmarks.models import sample_input

    body, headers = v2_request(a.input, a.output, sample_input(1))
    url = f"{a.url}/v2/models/{a.model}/infer"
    res = asyncio.run(run_load(url, body, headers, a.concurrency, a.seconds, a.warmup, a.max_requests))
    print(json.dumps(asdict(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
