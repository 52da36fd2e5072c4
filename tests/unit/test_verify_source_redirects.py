"""The verify step's fetch of an https model (issue 52): redirects only https to https, only to the
model's own host or a host the source allows, at most a few hops; the bytes must be an ONNX model
before anything goes to the broker; the failure says what really happened. Real HTTPS and HTTP
servers on loopback, `trtforge stage-model` run as its own process (as in the verify pod)."""

from __future__ import annotations

import json
import os
import random
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from trtforge_builder.fetch import MAX_REDIRECTS, redirect_refusal
from trtforge_builder.model_format import onnx_problem
from trtforge_dev.modelzoo import dynamic_cnn, sha256_of

from tests.certs import self_signed
from trtforge.contract.build_result import BUILD_EXIT_CODES, BuildFailure, parse_build_message

TOKEN = "tenant-token"


class Net:
    """An https model server (the tenant's), a plain-http server (what a redirect must not reach),
    and a plain-http "broker" that records every upload it is sent."""

    def __init__(self, tmp: Path) -> None:
        self.cert, key = self_signed(tmp, dns_names=("localhost",))  # two hosts, one loopback
        self.model = dynamic_cnn().read_bytes()
        self.seen: list[tuple[str, str, str | None]] = []  # (server, path, Authorization)
        self.uploads: list[str] = []
        net = self

        class Tenant(BaseHTTPRequestHandler):
            server_name_ = "tenant"

            def do_GET(self) -> None:
                net.seen.append((self.server_name_, self.path, self.headers.get("Authorization")))
                routes = net.routes()
                if self.path in routes:
                    self.send_response(302)
                    self.send_header("Location", routes[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = b'{"AccessKeyId": "AKIA...", "Token": "..."}' if self.path == "/creds" else net.model
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        class Plain(Tenant):
            server_name_ = "plain"

        class Broker(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                net.uploads.append(self.path)
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                body = json.dumps({"sha256": self.path.rsplit("/", 1)[-1], "sizeBytes": n}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.tenant = ThreadingHTTPServer(("127.0.0.1", 0), Tenant)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert), str(key))
        self.tenant.socket = ctx.wrap_socket(self.tenant.socket, server_side=True)
        self.plain = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
        self.broker = ThreadingHTTPServer(("127.0.0.1", 0), Broker)
        for s in (self.tenant, self.plain, self.broker):
            threading.Thread(target=s.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.tenant.server_address[1])

    def https(self, path: str, host: str = "127.0.0.1") -> str:
        return f"https://{host}:{self.port}{path}"

    def routes(self) -> dict[str, str]:
        hops = {f"/hop{i}": self.https(f"/hop{i + 1}") for i in range(MAX_REDIRECTS + 2)}
        return {
            "/to-http": f"http://127.0.0.1:{self.plain.server_address[1]}/m.onnx",
            "/to-other-host": self.https("/m.onnx", host="localhost"),
            "/to-same-host": "/m.onnx",
            "/to-creds": "/creds",
            **hops,
        }

    def close(self) -> None:
        for s in (self.tenant, self.plain, self.broker):
            s.shutdown()
            s.server_close()


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    n = Net(tmp_path)
    yield n
    n.close()


def stage(net: Net, tmp: Path, uri: str, *extra: str) -> tuple[int, BuildFailure | dict[str, object]]:
    """`trtforge stage-model` in its own process, trusting the loopback certificate; (exit code, the
    termination message)."""
    term = tmp / "termination-log"
    env = {
        **os.environ,
        "SSL_CERT_FILE": str(net.cert),
        "TRTFORGE_TERMINATION_LOG": str(term),
        "TRTFORGE_LOG_FORMAT": "text",
        "TRTFORGE_MODEL_TOKEN": TOKEN,
    }
    env.pop("TRTFORGE_BROKER_TOKEN_FILE", None)
    broker = f"http://127.0.0.1:{net.broker.server_address[1]}"
    p = subprocess.run(
        [sys.executable, "-m", "trtforge.cli", "stage-model", "--model", uri, "--broker", broker, *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "Traceback" not in p.stderr, p.stderr
    line = term.read_text().strip()
    msg = parse_build_message(line)
    return p.returncode, msg if isinstance(msg, BuildFailure) else json.loads(line)


def test_a_same_host_redirect_is_followed_and_the_model_uploaded(net: Net, tmp_path: Path) -> None:
    code, msg = stage(net, tmp_path, net.https("/to-same-host"))
    assert code == 0 and isinstance(msg, dict) and msg["sha256"] == sha256_of(dynamic_cnn())
    assert net.uploads == [f"/models/{sha256_of(dynamic_cnn())}"]
    assert net.seen == [
        ("tenant", "/to-same-host", f"Bearer {TOKEN}"),
        ("tenant", "/m.onnx", f"Bearer {TOKEN}"),
    ]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/to-http", "only https to https is followed"),
        ("/to-other-host", "host localhost:"),
        ("/hop0", f"more than {MAX_REDIRECTS} redirects"),
    ],
)
def test_a_refused_redirect_fails_the_verify_and_says_so(
    net: Net, tmp_path: Path, path: str, says: str
) -> None:
    code, msg = stage(net, tmp_path, net.https(path))
    assert isinstance(msg, BuildFailure), msg
    assert msg.reason == "ModelSourceRefused" and code == BUILD_EXIT_CODES["ModelSourceRefused"]
    assert "redirect refused" in msg.error and says in msg.error and "token" not in msg.error
    assert net.uploads == []  # nothing reached the broker
    assert not [s for s in net.seen if s[0] == "plain"]  # the http server was never asked


def test_a_host_the_source_allows_is_followed_without_the_token(net: Net, tmp_path: Path) -> None:
    code, msg = stage(
        net, tmp_path, net.https("/to-other-host"), "--allow-redirect-host", f"localhost:{net.port}"
    )
    assert code == 0 and isinstance(msg, dict), msg
    assert net.seen[-1] == ("tenant", "/m.onnx", None)  # the token stays with the model's own origin


def test_bytes_that_are_not_an_onnx_model_are_refused_before_upload(net: Net, tmp_path: Path) -> None:
    code, msg = stage(net, tmp_path, net.https("/to-creds"))
    assert isinstance(msg, BuildFailure), msg
    assert msg.reason == "InvalidModel" and code == BUILD_EXIT_CODES["InvalidModel"]
    assert "not an ONNX model" in msg.error and "nothing was uploaded" in msg.error
    assert net.uploads == []


@pytest.mark.parametrize(
    ("source", "current", "location", "hops", "allowed", "refused"),
    [
        ("https://a/m", "https://a/m", "https://a/n", 1, (), None),
        ("https://a/m", "https://a/m", "https://a:443/n", 1, (), None),
        ("https://a/m", "https://a/m", "https://a:8443/n", 1, (), "host a:8443"),
        ("https://a/m", "https://a/m", "https://b/n", 1, (), "host b:443"),
        ("https://a/m", "https://a/m", "https://b/n", 1, ("b",), None),
        ("https://a/m", "https://a/m", "https://b:8443/n", 1, ("b",), "host b:8443"),
        ("https://a/m", "https://a/m", "https://b:8443/n", 1, ("b:8443",), None),
        ("https://a/m", "https://a/m", "http://a/n", 1, (), "only https to https"),
        ("https://a/m", "https://a/m", "file:///etc/passwd", 1, (), "only https to https"),
        ("http://a/m", "http://a/m", "https://a/n", 1, (), "plain-http source follows no redirects"),
        ("https://a/m", "https://a/m", "https://A/n", 1, (), None),
        ("https://a/m", "https://a/m", "https://a/n", MAX_REDIRECTS + 1, (), "more than"),
    ],
)
def test_redirect_rule(
    source: str, current: str, location: str, hops: int, allowed: tuple[str, ...], refused: str | None
) -> None:
    why = redirect_refusal(source, current, location, hops, allowed)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why


def test_onnx_check(tmp_path: Path) -> None:
    good = dynamic_cnn()
    assert onnx_problem(good) is None
    cases = {
        "json": b'{"AccessKeyId": "x"}',
        "html": b"<html><body>metrics</body></html>",
        "prometheus": b"# HELP trtforge_builds_running x\n",
        "empty": b"",
        "truncated": good.read_bytes()[: len(good.read_bytes()) // 2],
        "random": random.Random(0).randbytes(4096),
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        assert onnx_problem(p) is not None, name
