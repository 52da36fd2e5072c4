"""HTTP/1.1 of a real `trtforge serve` (aiohttp) over raw sockets: keep-alive, pipelining, bodies in
any pieces, limits, refusals and back-pressure. Every answer is compared with ONNX Runtime run
directly, or with the status and the JSON error the request must get.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from trtforge_dev.hostile import binary_body
from trtforge_dev.serve_engines import MlpBed, copy_engine, make_mlp_bed, perturb_canary, run_ort

from tests.integration.serve_process import TALL_RCVBUF, Server, stall_and_send_more, tall_server

pytestmark = pytest.mark.integration

PATH = "/v2/models/mlp/infer"


Bed = MlpBed


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Bed:
    return make_mlp_bed(tmp_path_factory.mktemp("http"), mlp_seed=3)


@pytest.fixture(scope="module")
def server(bed: Bed) -> Iterator[Server]:
    s = Server(
        bed.store, bed.key, bed.tmp, bed.gpu_file, "--max-request-bytes", "100000", "--body-timeout", "1"
    )
    s.wait()
    yield s
    s.stop()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, object]:
        n = int(self.headers.get("inference-header-content-length", len(self.body)))
        out: dict[str, object] = json.loads(self.body[:n])
        return out


class Conn:
    """One raw keep-alive connection: send any bytes, read answers one by one."""

    def __init__(self, server: Server, rcvbuf: int = 0) -> None:
        self.sock = socket.socket()
        if rcvbuf:  # before connecting, so that the window the server sees is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(60)
        self.sock.connect(("127.0.0.1", server.port))
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        data = self.sock.recv(1 << 16)
        self.buf += data
        return bool(data)

    def answer(self) -> Answer:
        while b"\r\n\r\n" not in self.buf:
            assert self._fill(), f"connection closed; got {self.buf!r}"
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        n = int(headers["content-length"])
        while len(self.buf) < n:
            assert self._fill(), "connection closed mid-answer"
        body, self.buf = self.buf[:n], self.buf[n:]
        return Answer(status, headers, body)

    def closed(self) -> bool:
        """True once the server has closed the connection (waits for it)."""
        return not self._fill() and not self.buf

    def close(self) -> None:
        self.sock.close()


def request(body: bytes, headers: dict[str, str], path: str = PATH, extra: str = "") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: test", *(f"{k}: {v}" for k, v in headers.items())]
    if "Transfer-Encoding" not in headers:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + extra + "\r\n\r\n").encode() + body


def infer_bytes(x: np.ndarray, binary_output: bool = True) -> bytes:
    head = {
        "id": "r1",
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": list(x.shape),
                "parameters": {"binary_data_size": x.nbytes},
            }
        ],
        "outputs": [{"name": "y", "parameters": {"binary_data": binary_output}}],
    }
    h = json.dumps(head).encode()
    return request(h + x.tobytes(), {"Inference-Header-Content-Length": str(len(h))})


def output(a: Answer) -> np.ndarray:
    head = a.json()
    outs = head["outputs"]
    assert isinstance(outs, list)
    o = outs[0]
    if "parameters" in o:
        n = int(a.headers["inference-header-content-length"])
        return np.frombuffer(a.body[n:], np.float32).reshape(o["shape"])
    return np.array(o["data"], np.float32).reshape(o["shape"])


def xs(seed: int, rows: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


def test_tritonclient_answers_equal_onnxruntime(bed: Bed, server: Server) -> None:
    c = httpclient.InferenceServerClient(server.url, network_timeout=60)
    for seed in range(5):
        x = xs(seed, rows=seed + 1)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        for binary in (True, False):
            out = httpclient.InferRequestedOutput("y", binary_data=binary)
            r = c.infer("mlp", [inp], outputs=[out], request_id=f"q{seed}")
            assert r.get_response()["id"] == f"q{seed}"
            assert r.get_response()["model_name"] == "mlp"
            np.testing.assert_allclose(r.as_numpy("y"), run_ort(bed.mlp, {"x": x})["y"], rtol=1e-5, atol=1e-6)
    assert c.is_server_ready() and c.is_model_ready("mlp")
    c.close()


def test_pipelined_requests_are_answered_in_order(bed: Bed, server: Server) -> None:
    c = Conn(server)
    bad = request(b'{"inputs": [', {})
    c.send(infer_bytes(xs(1)) + bad + infer_bytes(xs(2), binary_output=False) + infer_bytes(xs(3)))
    first, err, second, third = (c.answer() for _ in range(4))
    assert [a.status for a in (first, err, second, third)] == [200, 400, 200, 200]
    assert "request JSON is not valid" in str(err.json()["error"])
    assert err.headers["content-type"] == "application/json"
    for a, seed in ((first, 1), (second, 2), (third, 3)):
        np.testing.assert_allclose(output(a), run_ort(bed.mlp, {"x": xs(seed)})["y"], rtol=1e-5, atol=1e-6)
        assert a.json()["id"] == "r1"
    c.close()


def test_a_pipeline_past_the_buffer_is_answered_and_the_connection_goes_on(bed: Bed, server: Server) -> None:
    """Twelve 8 KiB requests in one write, past the 64 KiB the server holds of later requests while
    one is answered (it stops reading there), then one more once all are answered: every answer
    comes, in order, equal to ONNX Runtime's. The server reads again once it has taken what it
    held, even when what it held ended at a request's end."""
    c = Conn(server)
    seeds = range(40, 52)
    c.send(b"".join(infer_bytes(xs(seed, rows=32)) for seed in seeds))
    for seed in [*seeds, 52]:
        if seed == 52:
            c.send(infer_bytes(xs(seed, rows=32)))
        a = c.answer()
        assert a.status == 200, (seed, a.headers)
        np.testing.assert_allclose(
            output(a), run_ort(bed.mlp, {"x": xs(seed, rows=32)})["y"], rtol=1e-5, atol=1e-6
        )
    c.close()


def test_chunked_bodies_and_health_probes_share_a_connection_with_infers(bed: Bed, server: Server) -> None:
    c = Conn(server)
    c.send(infer_bytes(xs(4)))
    assert c.answer().status == 200
    # A chunked body, then a Content-Length one, on the same connection.
    whole = infer_bytes(xs(5))
    head, body = whole.split(b"\r\n\r\n", 1)
    head = b"\r\n".join(ln for ln in head.split(b"\r\n") if not ln.startswith(b"Content-Length"))
    chunked = (
        head + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    )
    c.send(chunked)
    a = c.answer()
    assert a.status == 200
    np.testing.assert_allclose(output(a), run_ort(bed.mlp, {"x": xs(5)})["y"], rtol=1e-5, atol=1e-6)
    c.send(infer_bytes(xs(6)))
    a = c.answer()
    assert a.status == 200
    np.testing.assert_allclose(output(a), run_ort(bed.mlp, {"x": xs(6)})["y"], rtol=1e-5, atol=1e-6)
    c.close()
    # A health probe first, then an infer.
    c = Conn(server)
    c.send(b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n" + infer_bytes(xs(7)))
    ready, a = c.answer(), c.answer()
    assert (ready.status, a.status) == (200, 200)
    np.testing.assert_allclose(output(a), run_ort(bed.mlp, {"x": xs(7)})["y"], rtol=1e-5, atol=1e-6)
    c.close()


@pytest.mark.parametrize(
    ("what", "raw", "status", "message"),
    [
        ("over --max-request-bytes", request(b"x" * 100_001, {}), 413, "exceeds the limit of 100000"),
        ("gzip", request(b"x" * 10, {"Content-Encoding": "gzip"}), 400, "not valid gzip"),
        ("brotli", request(b"x" * 10, {"Content-Encoding": "br"}), 415, "not supported"),
        (
            "bad header length",
            request(b"{}", {"Inference-Header-Content-Length": "x"}),
            400,
            "not an integer",
        ),
        ("unknown model", request(b"{}", {}, path="/v2/models/nope/infer"), 404, "unknown model"),
        ("a version", request(b"{}", {}, path="/v2/models/mlp/versions/9/infer"), 404, "no version"),
    ],
)
def test_limits_are_refused_with_their_status(
    server: Server, what: str, raw: bytes, status: int, message: str
) -> None:
    c = Conn(server)
    c.send(raw)
    a = c.answer()
    assert a.status == status, what
    assert message in str(a.json()["error"]), (what, a.body)
    c.close()


@pytest.mark.parametrize(
    ("what", "body", "status", "message"),
    [
        ("two rows for one", binary_body("x", "FP32", [1, 64], bytes(512)), 400, "needs 256"),
        ("BYTES input", binary_body("x", "BYTES", [1, 64], bytes(4 * 64)), 400, "datatype BYTES"),
        ("empty", (b"", {}), 400, "not valid"),
        ("not an object", (b"[1, 2]", {}), 400, "must be an object"),
    ],
)
def test_bad_bodies_are_refused_and_the_connection_goes_on(
    server: Server, what: str, body: tuple[bytes, dict[str, str]], status: int, message: str
) -> None:
    c = Conn(server)
    c.send(request(*body))
    a = c.answer()
    assert a.status == status, (what, a.body)
    assert message in str(a.json()["error"]), (what, a.body)
    c.send(infer_bytes(xs(8)))  # the connection still serves
    assert c.answer().status == 200
    c.close()


def test_a_slow_body_gets_408_and_the_connection_closes(bed: Bed, server: Server) -> None:
    c = Conn(server)
    whole = infer_bytes(xs(9))
    c.send(whole[:-100])  # the head and most of the body; --body-timeout is 1 s
    a = c.answer()
    assert (a.status, a.headers["connection"]) == (408, "close")
    assert "--body-timeout" in str(a.json()["error"])
    assert c.closed()
    c.close()


def test_clients_that_vanish_mid_body_give_their_memory_back(bed: Bed, server: Server) -> None:
    """Each partial body holds what arrived of it in the shared budget (2 x 100000 bytes): if a
    vanished client kept its bytes, the next requests would find the budget full (503)."""
    for _ in range(10):
        c = Conn(server)
        c.send(request(b"x" * 99_000, {})[:-98_000])
        time.sleep(0.05)
        c.close()
    c = Conn(server)
    for _ in range(3):
        c.send(request(b"x" * 99_000, {"Inference-Header-Content-Length": "99000"}))
        a = c.answer()
        assert a.status == 400, a.body
    c.send(infer_bytes(xs(10)))
    a = c.answer()
    assert a.status == 200
    np.testing.assert_allclose(output(a), run_ort(bed.mlp, {"x": xs(10)})["y"], rtol=1e-5, atol=1e-6)
    c.close()


def test_connection_close_is_honoured(bed: Bed, server: Server) -> None:
    c = Conn(server)
    c.send(infer_bytes(xs(11)).replace(b"Host: test", b"Host: test\r\nConnection: close"))
    a = c.answer()
    assert (a.status, a.headers["connection"]) == (200, "close")
    np.testing.assert_allclose(output(a), run_ort(bed.mlp, {"x": xs(11)})["y"], rtol=1e-5, atol=1e-6)
    assert c.closed()
    c.close()


def test_queue_full_is_503_with_retry_after(bed: Bed) -> None:
    """One queue slot, one instance: 48 clients whose requests arrive together overflow it."""
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file, "--max-queue", "1", "--instances", "1", "--no-solo")
    try:
        s.wait()
        conns = [Conn(s) for _ in range(48)]
        for c in conns:
            c.send(infer_bytes(xs(12, rows=32)))  # a whole batch each: no two share an execution
        answers = [c.answer() for c in conns]
        statuses = sorted({a.status for a in answers})
        assert statuses == [200, 503], statuses
        full = [a for a in answers if a.status == 503]
        assert all(a.headers["retry-after"] == "1" for a in full)
        assert all("queue is full" in str(a.json()["error"]) for a in full)
        for c in conns:
            c.close()
    finally:
        s.stop()


def test_not_ready_is_503_with_retry_after(bed: Bed) -> None:
    """A failed canary keeps the server not ready: infer requests get 503 naming it."""
    store = bed.tmp / "store-canary"
    key = copy_engine(bed.store, bed.key, store)
    perturb_canary(store, key, 0.5)
    s = Server(store, key, bed.tmp, bed.gpu_file, cache=bed.tmp / "cache-canary")
    try:
        s.wait("live")
        c = Conn(s)
        while True:
            c.send(infer_bytes(xs(13)))
            a = c.answer()
            assert (a.status, a.headers["retry-after"]) == (503, "1")
            if "canary failed" in str(a.json()["error"]):
                break
            time.sleep(0.05)  # still loading: "not loaded yet", the same 503
        c.close()
    finally:
        assert s.stop() == 0


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Bed]]:
    """An MLP with 8192 inputs a row (32 KiB): a request's body spans many of the socket's reads."""
    bed = make_mlp_bed(tmp_path_factory.mktemp("httpwide"), mlp_seed=13, features=8192)
    s = Server(bed.store, bed.key, bed.tmp, bed.gpu_file)
    s.wait()
    yield s, bed
    s.stop()


def test_large_bodies_are_read_whole_however_their_bytes_arrive(wide: tuple[Server, Bed]) -> None:
    """Bodies of up to 1 MiB in one write, in pieces of odd sizes, three requests in one write, and a
    body whose last bytes share a write with the next request's head: every answer equals ONNX
    Runtime's, on one connection; tritonclient is answered afterwards."""
    server, bed = wide
    rng = np.random.default_rng(11)

    def wide_x(rows: int) -> np.ndarray:
        return rng.standard_normal((rows, 8192)).astype(np.float32)

    def check(a: Answer, x: np.ndarray) -> None:
        assert a.status == 200, (a.status, a.body[:200])
        np.testing.assert_allclose(output(a), run_ort(bed.mlp, {"x": x})["y"], rtol=1e-4, atol=1e-5)

    c = Conn(server)
    x = wide_x(32)  # 1 MiB of body
    c.send(infer_bytes(x))
    check(c.answer(), x)

    x = wide_x(20)
    data = infer_bytes(x)
    head_end = data.index(b"\r\n\r\n") + 4
    for start, end in ((0, head_end - 2), (head_end - 2, head_end + 5), (head_end + 5, 70001)):
        c.send(data[start:end])
        time.sleep(0.02)  # separate reads, most likely
    for start in range(70001, len(data), 50003):
        c.send(data[start : start + 50003])
    check(c.answer(), x)

    batch = [wide_x(n) for n in (7, 1, 30)]
    c.send(b"".join(infer_bytes(x) for x in batch))
    for x in batch:
        check(c.answer(), x)

    first, second = wide_x(3), wide_x(5)
    a, b = infer_bytes(first), infer_bytes(second)
    c.send(a[: len(a) - 100])
    time.sleep(0.02)
    c.send(a[len(a) - 100 :] + b[:40])  # the first body's end and the start of the next head
    c.send(b[40:])
    check(c.answer(), first)
    check(c.answer(), second)
    c.close()

    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    x = wide_x(16)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    got = client.infer("mlp", [inp]).as_numpy("y")
    np.testing.assert_allclose(got, run_ort(bed.mlp, {"x": x})["y"], rtol=1e-4, atol=1e-5)
    client.close()


def test_no_request_is_taken_while_the_client_does_not_read(tmp_path: Path) -> None:
    """Requests with 1 MiB answers from a client that reads nothing: the server answers until its
    writes back up, then takes no request, neither the next one nor more sent in writes of their
    own; once the client reads what was answered, the server answers at most what fits before it
    stops again; in the end every request is answered in order, equal to ONNX Runtime's."""
    x = np.random.default_rng(21).standard_normal((32, 64)).astype(np.float32)
    with tall_server(tmp_path, mlp_seed=21) as (server, bed):
        want = run_ort(bed.mlp, {"x": x})["y"]
        body = infer_bytes(x)
        c = Conn(server, rcvbuf=TALL_RCVBUF)
        st = stall_and_send_more(server, lambda: c.send(body), want.nbytes)
        for _ in range(st.taken):
            np.testing.assert_allclose(output(c.answer()), want, rtol=1e-5, atol=1e-6)
        more = server.answered_until(st.base, st.sent) - st.taken
        assert 0 < more <= st.bound, f"{more} answered once the client read, {st.bound} fit"
        for _ in range(st.sent - st.taken):
            a = c.answer()
            assert a.status == 200, a.headers
            np.testing.assert_allclose(output(a), want, rtol=1e-5, atol=1e-6)
        assert server.answered() - st.base == st.sent
        c.close()
