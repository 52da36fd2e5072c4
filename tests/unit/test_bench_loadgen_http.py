"""benchmarks.loadgen's HTTP clients, the Python one and the native one (benchmarks/native/v2load.c,
built with cc), against a real HTTP/1.1 server (the standard library's) over a real socket:
keep-alive, a server that closes connections, chunked answers, answers checked, errors counted."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from benchmarks.loadgen import HEADER, Check, run_load

X = np.arange(6, dtype=np.float32).reshape(1, 6)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    lock = threading.Lock()  # each connection has a thread of its own: the counts are shared
    answers = 0
    connections = 0
    close_every = 0  # close the connection after every n-th answer (0: never)
    status = 200
    offset = 0.0  # added to the answer (not 0: a wrong answer)
    chunked = False  # send the answer in chunks (Transfer-Encoding: chunked), split mid-tensor
    output = "y"  # the name the answer gives its output


class _V2(BaseHTTPRequestHandler):
    """Answers a v2 binary request with y = 2 x, as a v2 binary response."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # head and body: two writes
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        n = int(self.headers[HEADER])
        x = np.frombuffer(body[n:], np.float32)
        y = (2 * x + self.server.offset).astype(np.float32).tobytes()
        out = {
            "name": self.server.output,
            "datatype": "FP32",
            "shape": [1, x.size],
            "parameters": {"binary_data_size": len(y)},
        }
        head = json.dumps({"outputs": [out]}).encode()
        with self.server.lock:
            self.server.answers += 1
            answers = self.server.answers
        close = bool(self.server.close_every) and answers % self.server.close_every == 0
        self.send_response(self.server.status)
        if self.server.chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(head) + len(y)))
        self.send_header(HEADER, str(len(head)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if not self.server.chunked:
            self.wfile.write(head + y)
            return
        data, cut = head + y, len(head) + 5
        for part in (data[:cut], data[cut:]):
            self.wfile.write(b"%x;ext=1\r\n%s\r\n" % (len(part), part))
            self.wfile.flush()
        self.wfile.write(b"0\r\nX-Trailer: 1\r\n\r\n")


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _V2)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(params=["python", "native"])
def client(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _load(
    srv: _Server, client: str, check: Check | None, concurrency: int = 4, max_requests: int = 200
) -> dict[str, object]:
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    # The run ends at `max_requests`; its window (a day) never ends it, so no count depends on time.
    res, _ = run_load(
        "http", url, "m", "x", "y", X, concurrency, 86_400.0, 0.0, max_requests, check, client=client
    )
    assert res.client == client
    return vars(res)


def test_every_answer_is_read_and_checked_over_keep_alive_connections(server: _Server, client: str) -> None:
    res = _load(server, client, Check("y", 2 * X))
    assert (res["errors"], res["completed"]) == (0, 200) and server.answers == 200
    assert server.connections == 4  # one keep-alive connection per worker


def test_a_server_that_closes_connections_is_reconnected_to(server: _Server, client: str) -> None:
    server.close_every = 3
    res = _load(server, client, Check("y", 2 * X))
    assert (res["errors"], res["completed"]) == (0, 200)
    assert server.connections > 4  # reconnected after each close


def test_wrong_answers_and_error_statuses_count_as_errors(server: _Server, client: str) -> None:
    server.offset = 1.0
    res = _load(server, client, Check("y", 2 * X), max_requests=20)
    assert res["errors"] == 20 and res["completed"] == 0
    assert "wrong answer: max abs error 1 > 0.0001" in res["error_samples"][0]  # type: ignore[index]
    server.offset, server.status = 0.0, 503
    res = _load(server, client, None, concurrency=1, max_requests=3)
    assert res["errors"] == 3 and res["error_samples"] == ["HTTP 503"] * 3


def test_chunked_answers_are_joined_and_checked(server: _Server, client: str) -> None:
    server.chunked = True
    server.close_every = 5
    res = _load(server, client, Check("y", 2 * X), max_requests=40)
    assert (res["errors"], res["completed"]) == (0, 40)


def test_an_answer_without_the_output_asked_for_is_an_error(server: _Server, client: str) -> None:
    server.output = "z"
    res = _load(server, client, Check("y", 2 * X), max_requests=8)
    assert res["errors"] == 8 and res["completed"] == 0
    assert "no output" in res["error_samples"][0]  # type: ignore[index]


def test_a_refused_connection_is_an_error_not_a_crash(client: str) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res, _ = run_load(
        "http", f"http://127.0.0.1:{port}", "m", "x", "y", X, 2, 86_400.0, 0.0, 6, None, client=client
    )
    assert (res.errors, res.completed) == (6, 0)
    assert "Connection" in res.error_samples[0]
