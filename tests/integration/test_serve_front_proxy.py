"""The runtime's front proxy (HAProxy, configured by the operator's one template,
trtforge_operator.apply.front_proxy) in front of a real `trtforge serve`, against the hostile-client
suite's own attackers: what the proxy holds that the server alone does not. Each case runs against the
server alone and then through the proxy, the attackers from their own loopback address (127.0.0.2) and
the legitimate clients from 127.0.0.1, as different clients would be.

- HEADERS on streams already closed (RFC 9113 §5.1: a connection error): grpcio answers with
  RST_STREAM and the attacker keeps its connection; the proxy answers with GOAWAY and closes it.
- Connections per client: the server takes every connection a client opens; the proxy keeps a
  client's gRPC connections to its share (a quarter of the call slots) and closes the rest at once.

Behaviour only; the timings are benchmarks/hostile.py's (`--part front-door --front-proxy haproxy`).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hyperframe.frame import SettingsFrame
from trtforge_dev.hostile import Target, rss_kb
from trtforge_dev.hostile_h2 import PREFACE
from trtforge_dev.hostile_run import under_attack
from trtforge_dev.serve_engines import make_mlp_bed, run_ort
from trtforge_dev.testbed.procs import free_ports
from trtforge_operator.apply.front_proxy import FrontProxyLimits, haproxy_config

from tests.integration.serve_process import Server

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("haproxy") is None,
        reason="no haproxy binary: `make deps` (and so `make test`) installs Debian's haproxy (APT_PACKAGES)",
    ),
]

ATTACKER = "127.0.0.2"
LIMITS = FrontProxyLimits()


@dataclass
class World:
    server: Server
    direct: Target  # the server alone
    proxied: Target  # the same server through HAProxy
    reference: np.ndarray
    idle_kb: int
    tmp: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("front-proxy")
    bed = make_mlp_bed(tmp, mlp_seed=63)
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file, *LIMITS.runtime_args())
    http_port, grpc_port = free_ports(2)
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(
        haproxy_config(
            LIMITS,
            http_port=http_port,
            grpc_port=grpc_port,
            runtime_http_port=s.port,
            runtime_grpc_port=s.grpc_port,
            bind="127.0.0.1",
        )
    )
    check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log = open(tmp / "haproxy.log", "w")  # noqa: SIM115 (closed below)
    proxy = subprocess.Popen(["haproxy", "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        s.wait()
        x = np.random.default_rng(63).standard_normal((2, 64)).astype(np.float32)
        direct = Target("127.0.0.1", s.grpc_port, s.port, "mlp", "x", x, source=ATTACKER)
        proxied = Target("127.0.0.1", grpc_port, http_port, "mlp", "x", x, source=ATTACKER)
        _wait_ready(proxied)
        yield World(s, direct, proxied, run_ort(bed.mlp, {"x": x})["y"], rss_kb(s.proc.pid, "VmRSS"), tmp)
    finally:
        proxy.terminate()
        proxy.wait(30)
        log.close()
        assert s.stop() == 0, s.output()[-5000:]


def _wait_ready(t: Target, timeout: float = 60.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{t.host}:{t.http_port}/v2/health/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


# Legitimate infers a second on each protocol: a client within the proxy's per-client rates (200
# calls and 200 new connections a second), as in benchmarks/hostile.py. Back to back, the proxy
# rightly refuses 127.0.0.1 itself, the probe included.
LEGIT_RATE = 100.0


def _legit_answered(
    world: World, target: Target, family: str, record: Callable[[str, object], None]
) -> Counter[str]:
    """`family` against `target` while legitimate HTTP and gRPC infers (from 127.0.0.1) run: every
    probe answered, at least 95% of the infers right and none wrong; the attack's counters."""
    out = under_attack(
        family,
        target,
        pid=world.server.proc.pid,
        idle_rss_kb=world.idle_kb,
        output="y",
        reference=world.reference,
        probe_out=world.tmp / f"probe-{family}-{target.grpc_port}",
        seconds=2.0,
        min_infers=20,
        legit_rate=LEGIT_RATE,
    )
    summary = out.summary()
    print(f"\n{family} on port {target.grpc_port}: {summary}")
    record(f"{family}-{target.grpc_port}", summary)
    assert out.alive, world.server.output()[-5000:]
    assert out.probe_statuses and all(st == "200" for st in out.probe_statuses), (
        Counter(out.probe_statuses),
        summary,
    )
    for protocol, legit in out.legit.items():
        assert legit.wrong == 0 and legit.success_rate >= 0.95, (protocol, summary)
    return Counter(out.counters)


def test_headers_on_closed_streams_get_goaway_only_through_the_proxy(
    world: World, record_property: Callable[[str, object], None]
) -> None:
    alone = _legit_answered(world, world.direct, "headers_on_closed_streams", record_property)
    assert alone["goaway"] == 0, alone  # grpcio resets the stream; the attacker keeps its connection
    proxied = _legit_answered(world, world.proxied, "headers_on_closed_streams", record_property)
    assert proxied["goaway"] >= 1 and proxied["closed_by_server"] >= 1, proxied
    assert proxied["connections"] > alone["connections"], (alone, proxied)  # it had to reconnect


def _connect(target: Target) -> socket.socket | None:
    try:
        return target.connect(target.grpc_port, 5)
    except ConnectionResetError:  # a proxy past its per-client share may reset it that soon
        return None


def _open(target: Target, n: int) -> list[socket.socket]:
    """`n` HTTP/2 connections from the attacker's address, each having sent the preface; one the
    proxy resets before its connect returns is closed already and left out."""
    socks = [s for s in (_connect(target) for _ in range(n)) if s is not None]
    for s in socks:
        try:
            s.sendall(PREFACE + SettingsFrame(0).serialize())
        except OSError:
            pass  # closed already
    return socks


def _still_open(socks: list[socket.socket]) -> int:
    """How many of `socks` the other side has not closed (read to the end of what it sent)."""
    held = 0
    for s in socks:
        s.settimeout(0.5)
        try:
            while s.recv(65536):
                pass
        except TimeoutError:
            held += 1  # nothing more to read, and not closed
        except OSError:
            pass  # reset: closed
    return held


def _infer(world: World, t: Target) -> np.ndarray:
    import tritonclient.grpc as grpc

    client = grpc.InferenceServerClient(f"{t.host}:{t.grpc_port}")
    try:
        inp = grpc.InferInput("x", list(t.sample.shape), "FP32")
        inp.set_data_from_numpy(t.sample)
        return client.infer("mlp", [inp], client_timeout=30).as_numpy("y")
    finally:
        client.close()


@pytest.mark.parametrize("through_proxy", [False, True], ids=["server-alone", "through-proxy"])
def test_a_clients_grpc_connections_are_capped_only_through_the_proxy(
    world: World, through_proxy: bool
) -> None:
    """12 connections from one client: the server alone holds them all; the proxy holds its
    per-client share (4) and closes the rest at once. Another client is answered meanwhile."""
    target = world.proxied if through_proxy else world.direct
    n = 3 * LIMITS.grpc_connections_per_client
    socks = _open(target, n)
    try:
        time.sleep(1.0)
        legit = Target(target.host, target.grpc_port, target.http_port, "mlp", "x", target.sample)
        assert np.allclose(_infer(world, legit), world.reference, rtol=1e-4, atol=1e-5)
        held = _still_open(socks)
    finally:
        for s in socks:
            s.close()
    assert held == (LIMITS.grpc_connections_per_client if through_proxy else n)


def test_the_shipped_config_is_valid_for_haproxy(tmp_path: Path) -> None:
    chart = Path(__file__).resolve().parents[2] / "charts" / "trtforge" / "files" / "runtime-front-proxy.cfg"
    check = subprocess.run(["haproxy", "-c", "-f", str(chart)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
