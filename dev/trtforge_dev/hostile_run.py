"""One attack family against a running ``trtforge serve``, with everything a hostile-client check
watches meanwhile: ``/v2/health/live`` polled from a process of its own (:class:`LiveProbe`),
legitimate infers over HTTP and gRPC (``tritonclient``) compared with a reference the caller got
from ONNX Runtime, and the server's RSS. Shared by the hostile-client suite
(tests/integration/test_serve_hostile_families.py), which asserts on the :class:`Outcome`, and the
liveness benchmark (benchmarks/hostile.py), which records it.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trtforge_dev.hostile import H1_ATTACKS, LiveProbe, Target, rss_kb
from trtforge_dev.hostile_h2 import H2_ATTACKS, Attack

FAMILIES: dict[str, Attack] = {**H2_ATTACKS, **H1_ATTACKS}
GRPC_FAMILIES = frozenset(H2_ATTACKS)
QUIET = "quiet"  # no attack: the baseline


def quiet(target: Target, stop: threading.Event, counters: Counter[str]) -> None:
    stop.wait()


REPORT_S = 0.1  # how often an attack process sends its counters


def _attack_main(family: str, target: Target, stop: Any, conn: Any) -> None:
    """The body of an :class:`AttackProcess`: the family's attack in a thread, its counters sent to
    `conn` every REPORT_S and once more when it has stopped."""
    counters: Counter[str] = Counter()
    halt = threading.Event()
    attack = FAMILIES.get(family, quiet)
    thread = threading.Thread(target=attack, args=(target, halt, counters), daemon=True)
    conn.send({})  # ready: its imports are done
    thread.start()
    while not stop.wait(REPORT_S):
        conn.send(dict(counters))
    halt.set()
    thread.join(timeout=60)
    conn.send(dict(counters))
    conn.close()


class AttackProcess:
    """One attack family in a process of its own. In a thread of the process that runs the
    legitimate clients, the attacker's Python loops held the GIL those clients need, so their
    latency measured the attacker's client as much as the server."""

    def __init__(self, family: str, target: Target) -> None:
        ctx = multiprocessing.get_context("spawn")  # not fork: the parent runs grpc's threads
        self._stop = ctx.Event()
        self._recv, self._send = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(
            target=_attack_main, args=(family, target, self._stop, self._send), daemon=True
        )
        self.counters: Counter[str] = Counter()

    def start(self) -> None:
        """Start it and wait until it attacks."""
        self._proc.start()
        self._send.close()
        self._recv.recv()

    def poll(self) -> Counter[str]:
        """Its latest counters."""
        try:
            while self._recv.poll():
                self.counters = Counter(self._recv.recv())
        except (EOFError, OSError):
            pass
        return self.counters

    def stop(self) -> Counter[str]:
        """Stop it; its final counters."""
        self._stop.set()
        self._proc.join(timeout=90)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        counters = self.poll()
        self._recv.close()
        return counters


# Families whose legitimate clients are new ones: a fresh client (connection) for every infer.
FRESH_CLIENT_FAMILIES = frozenset({"no_preface", "slowloris_1100"})


@dataclass
class Legit:
    """Legitimate infers of one protocol: how many were answered right, wrong, or not at all."""

    protocol: str
    ok: int = 0
    wrong: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)  # each kind's first message, to read
    latencies: list[float] = field(default_factory=list)  # seconds, of the infers answered right

    @property
    def attempts(self) -> int:
        return self.ok + self.wrong + sum(self.errors.values())

    @property
    def success_rate(self) -> float:
        return self.ok / self.attempts if self.attempts else 0.0

    @property
    def p50_ms(self) -> float:
        lat = sorted(self.latencies)
        return lat[(len(lat) - 1) // 2] * 1e3 if lat else float("nan")


class LegitLoad:
    """One thread of back-to-back infers over `protocol` ("http" or "grpc"), each answer compared
    with `reference` (ONNX Runtime's output for `target.sample`). `fresh_clients`: a new client (so a
    new connection) for every infer, as a newly arriving client would. `rate`: at most that many
    infers a second (a client within a proxy's per-client call rate); None: back to back."""

    def __init__(
        self,
        target: Target,
        protocol: str,
        output: str,
        reference: np.ndarray,
        fresh_clients: bool = False,
        rate: float | None = None,
    ) -> None:
        self.target, self.output, self.reference, self.fresh = target, output, reference, fresh_clients
        self.interval = 1.0 / rate if rate else 0.0
        self.result = Legit(protocol)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _client(self) -> tuple[Callable[[], np.ndarray], Callable[[], None]]:
        """An infer of `target.sample` on a new client, and the client's close."""
        t = self.target
        if self.result.protocol == "http":
            import tritonclient.http as http

            hc = http.InferenceServerClient(
                f"{t.host}:{t.http_port}", network_timeout=30, connection_timeout=30
            )
            hi = http.InferInput(t.input_name, list(t.sample.shape), "FP32")
            hi.set_data_from_numpy(t.sample)
            return lambda: hc.infer(t.model, [hi]).as_numpy(self.output), hc.close
        import tritonclient.grpc as grpc

        gc = grpc.InferenceServerClient(f"{t.host}:{t.grpc_port}")
        gi = grpc.InferInput(t.input_name, list(t.sample.shape), "FP32")
        gi.set_data_from_numpy(t.sample)
        return lambda: gc.infer(t.model, [gi], client_timeout=30).as_numpy(self.output), gc.close

    def _run(self) -> None:
        client: tuple[Callable[[], np.ndarray], Callable[[], None]] | None = None
        next_t = time.monotonic()
        while not self.stop.is_set():
            if self.interval:
                self.stop.wait(max(0.0, next_t - time.monotonic()))
                next_t = max(next_t + self.interval, time.monotonic())
                if self.stop.is_set():
                    break
            failed = False
            try:
                if client is None:
                    client = self._client()
                t0 = time.perf_counter()
                got = client[0]()
                took = time.perf_counter() - t0
            except Exception as e:  # every failure is counted, by kind
                kind = _error_kind(e)
                self.result.errors[kind] += 1
                self.result.first_error.setdefault(kind, str(e)[:300])
                failed = True
            else:
                if got is not None and np.allclose(got, self.reference, rtol=1e-4, atol=1e-5):
                    self.result.ok += 1
                    self.result.latencies.append(took)
                else:
                    self.result.wrong += 1
            if client is not None and (failed or self.fresh):
                client[1]()
                client = None
        if client is not None:
            client[1]()

    def __enter__(self) -> LegitLoad:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _error_kind(e: Exception) -> str:
    status = getattr(e, "status", None)
    code = status() if callable(status) else status
    return f"{type(e).__name__}:{code}" if code else type(e).__name__


@dataclass
class Outcome:
    """What one attack did and what the server did meanwhile."""

    family: str
    seconds: float
    counters: dict[str, int]
    legit: dict[str, Legit]
    probe_statuses: list[str]
    probe_latencies: list[float]
    rss_start_above_idle_mb: float  # when the attack began (what earlier attacks left)
    rss_peak_above_idle_mb: float
    alive: bool

    def probe_quantile(self, q: float) -> float:
        """The `q` quantile (0..1) of the liveness probes' latency, in ms (nearest rank)."""
        lat = sorted(self.probe_latencies)
        return lat[min(len(lat) - 1, max(0, int(np.ceil(q * len(lat))) - 1))] * 1e3 if lat else float("nan")

    def summary(self) -> dict[str, object]:
        return {
            "seconds": round(self.seconds, 1),
            "probes": len(self.probe_latencies),
            "probes_failed": sum(s != "200" for s in self.probe_statuses),
            "health_p50_ms": round(self.probe_quantile(0.5), 1),
            "health_p99_ms": round(self.probe_quantile(0.99), 1),
            "health_max_ms": round(max(self.probe_latencies, default=float("nan")) * 1e3, 1),
            **{
                f"{p}_success": f"{r.ok}/{r.attempts}"
                + (f" ({dict(r.errors)}, first: {r.first_error})" if r.errors else "")
                for p, r in self.legit.items()
            },
            **{f"{p}_success_rate": round(r.success_rate, 3) for p, r in self.legit.items()},
            **{f"{p}_p50_ms": round(r.p50_ms, 2) for p, r in self.legit.items()},
            "rss_start_above_idle_mb": round(self.rss_start_above_idle_mb, 1),
            "rss_peak_above_idle_mb": round(self.rss_peak_above_idle_mb, 1),
            "alive": self.alive,
            "attack": dict(sorted(self.counters.items())),
        }


def under_attack(
    family: str,
    target: Target,
    *,
    pid: int,
    idle_rss_kb: int,
    output: str,
    reference: np.ndarray,
    probe_out: Path,
    seconds: float,
    min_infers: int = 0,
    until: Callable[[Counter[str]], bool] | None = None,
    max_seconds: float = 120.0,
    probe_cpus: str | None = None,
    fresh_clients: bool | None = None,
    legit_rate: float | None = None,
) -> Outcome:
    """Run the attack `family` for at least `seconds`, and on until each protocol's legitimate load
    has made `min_infers` infers and `until` (if given) holds of the attack's counters, or
    `max_seconds` have passed; meanwhile the probe, the legitimate load (HTTP and gRPC; a fresh client
    for every infer in FRESH_CLIENT_FAMILIES, or as `fresh_clients` says; at most `legit_rate` infers a
    second each, if given) and the server's RSS (sampled every 50 ms) are watched. The family
    :data:`QUIET` attacks nothing: the same run's baseline."""
    if family != QUIET and family not in FAMILIES:
        raise KeyError(f"unknown attack family {family!r}")
    protocols = ["http", "grpc"]
    fresh = family in FRESH_CLIENT_FAMILIES if fresh_clients is None else fresh_clients
    attacker = AttackProcess(family, target)
    start_kb = peak_kb = rss_kb(pid, "VmRSS")
    alive = True
    with LiveProbe(f"{target.host}:{target.http_port}", probe_out, cpus=probe_cpus) as probe:
        loads = [
            LegitLoad(target, p, output, reference, fresh_clients=fresh, rate=legit_rate) for p in protocols
        ]
        attacker.start()
        t0 = time.monotonic()
        for load in loads:
            load.__enter__()
        try:
            while True:
                try:
                    peak_kb = max(peak_kb, rss_kb(pid, "VmRSS"))
                except (OSError, KeyError):
                    alive = False
                    break
                elapsed = time.monotonic() - t0
                if elapsed >= max_seconds:
                    break
                if (
                    elapsed >= seconds
                    and all(load.result.attempts >= min_infers for load in loads)
                    and (until is None or until(attacker.poll()))
                ):
                    break
                time.sleep(0.05)
        finally:
            counters = attacker.stop()
            elapsed = time.monotonic() - t0
            for load in loads:
                load.__exit__()
    try:
        alive = (
            alive
            and Path(f"/proc/{pid}").exists()
            and "zombie" not in Path(f"/proc/{pid}/status").read_text()
        )
    except OSError:
        alive = False
    return Outcome(
        family=family,
        seconds=elapsed,
        counters=dict(counters),
        legit={load.result.protocol: load.result for load in loads},
        probe_statuses=probe.statuses,
        probe_latencies=probe.latencies,
        rss_start_above_idle_mb=(start_kb - idle_rss_kb) / 1024,
        rss_peak_above_idle_mb=(peak_kb - idle_rss_kb) / 1024,
        alive=alive,
    )
