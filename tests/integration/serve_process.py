"""A `trtforge serve` subprocess on a loopback port, for the serve tests (no Kubernetes)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trtforge_dev.serve_engines import MlpBed, env_for, make_mlp_bed
from trtforge_dev.testbed.procs import free_ports

TALL_OUTPUTS = 8192  # outputs per row of the tall MLP: 32 rows make a 1 MiB answer


def metric_value(text: str, series: str) -> float | None:
    """The value of `series` (its name and labels as /metrics writes them) in the exposition
    `text`; None when it is not there."""
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None


def metric_in(text: str, series: str) -> float:
    """The value of `series` in the exposition `text`, which must have it."""
    value = metric_value(text, series)
    assert value is not None, f"{series} not in /metrics"
    return value


def serve_once(
    store: Path, key: str, gpu_file: Path, term: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    """`trtforge serve` of `key` from `store` with `extra` flags, run to its end and captured: for the
    command lines the CLI refuses before it serves."""
    return subprocess.run(
        [sys.executable, "-m", "trtforge.cli", "serve", "--store", str(store), "--engine", key, *extra],
        capture_output=True,
        text=True,
        env=env_for(gpu_file, term),
        timeout=60,
    )


class Server:
    def __init__(
        self, store: Path | str, key: str, tmp: Path, gpu_file: Path, *extra: str, cache: Path | None = None
    ):
        self.port, self.grpc_port = free_ports(2)
        self.url = f"127.0.0.1:{self.port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.term = tmp / f"termination-{self.port}"
        self.log = tmp / f"serve-{self.port}.log"
        self.cache = cache or tmp / "cache"
        cmd = [
            sys.executable,
            "-m",
            "trtforge.cli",
            "serve",
            "--store",
            str(store),
            "--engine",
            key,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--cache-dir",
            str(self.cache),
            "--grpc-port",
            str(self.grpc_port),
            *extra,
        ]
        self._log_f = open(self.log, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            cmd, env=env_for(gpu_file, self.term), stdout=self._log_f, stderr=subprocess.STDOUT
        )

    def get(self, path: str) -> tuple[int, dict[str, object]]:
        try:
            with urllib.request.urlopen(f"http://{self.url}{path}", timeout=5) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def wait(self, what: str = "ready", timeout: float = 60.0) -> None:
        """Until /v2/health/<what> answers 200 (or the process ends: then fail with its log)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if self.get(f"/v2/health/{what}")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"serve not {what} after {timeout}s:\n{self.output()}")

    def metrics(self) -> str:
        """The server's /metrics exposition."""
        with urllib.request.urlopen(f"http://{self.url}/metrics", timeout=30) as r:
            text: str = r.read().decode()
        return text

    def metric(self, series: str) -> float:
        """The value of `series` on /metrics (:func:`metric_in`)."""
        return metric_in(self.metrics(), series)

    def requests(self, outcome: str, model: str = "mlp") -> float:
        """Requests of `model` counted with `outcome` so far, over every protocol (0 before the
        first: the series appears with it)."""
        series = f'trtforge_runtime_requests_total{{model="{model}",outcome="{outcome}"}}'
        return metric_value(self.metrics(), series) or 0.0

    def answered(self) -> int:
        """Inference requests of the MLP answered with success so far, over every protocol."""
        return int(self.requests("success"))

    def answered_until(self, base: int, target: int, looks: int = 40) -> int:
        """Requests answered since `base` (an earlier `answered()`), looked at up to `looks` times
        50 ms apart until `target` is reached: waits the whole time when it is not."""
        got = self.answered() - base
        for _ in range(looks - 1):
            if got >= target:
                break
            time.sleep(0.05)
            got = self.answered() - base
        return got

    def exit_code(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        if not self._log_f.closed:
            self._log_f.flush()
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log_f.close()
        return self.proc.returncode


@contextmanager
def tall_server(tmp: Path, mlp_seed: int) -> Iterator[tuple[Server, MlpBed]]:
    """A server of an MLP with `TALL_OUTPUTS` outputs a row: a few answers fill the kernel's
    buffers of a client that does not read."""
    bed = make_mlp_bed(tmp, mlp_seed=mlp_seed, outputs=TALL_OUTPUTS)
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file)
    try:
        s.wait()
        yield s, bed
    finally:
        assert s.stop() == 0, s.output()


TALL_RCVBUF = 64 << 10  # the receive buffer of a client that does not read the tall MLP's answers


def answers_that_fit(answer_bytes: int, rcvbuf: int) -> int:
    """At most how many answers of `answer_bytes` a server can write before its transport holds
    one it cannot send, to a client with receive buffer `rcvbuf` that does not read: the largest
    send buffer Linux grows to (tcp_wmem's third field), the client's buffer (which Linux doubles),
    the one the transport holds, and one for rounding."""
    wmem_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    return -(-(wmem_max + 2 * rcvbuf) // answer_bytes) + 2


@dataclass(frozen=True)
class Stall:
    base: int  # `Server.answered()` before the first request
    taken: int  # requests answered before the server stopped
    sent: int  # requests sent in all
    bound: int  # `answers_that_fit` for the answers and `TALL_RCVBUF`


def stall_and_send_more(server: Server, send: Callable[[], None], answer_bytes: int) -> Stall:
    """Send requests with `send` to a client with `TALL_RCVBUF` that does not read: one at a time,
    each once the one before is answered, until one is not (failing once `bound` are answered:
    the server never stopped); then `bound` + 2 more, each in a write of its own, and check that
    the server takes none of them."""
    bound = answers_that_fit(answer_bytes, TALL_RCVBUF)
    base = server.answered()
    for taken in range(bound):
        send()
        if server.answered_until(base, taken + 1) <= taken:
            break
    else:
        raise AssertionError(
            f"{bound} requests answered to a client that reads nothing: the server did not stop"
        )
    for _ in range(bound + 2):
        send()
    assert server.answered_until(base, taken + 1) == taken, "a request was taken while writing was paused"
    return Stall(base, taken, taken + 1 + bound + 2, bound)
