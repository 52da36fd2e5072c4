"""An https/http model behind a bearer token: the builder sends the Secret's token to the model's host
only, and a refusal names the cause. Real sockets on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from trtforge_builder.errors import BuildError
from trtforge_builder.fetch import TOKEN_ENV, fetch_model
from trtforge_dev.modelzoo import dynamic_cnn, sha256_of

from tests.unit.test_build_errors import PROFILE, build, nothing_published

TOKEN = "s3cret-token"


class _Servers:
    def __init__(self, model: bytes) -> None:
        self.model = model
        self.seen_by_other: list[str | None] = []
        servers = self

        class Model(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/elsewhere.onnx":
                    self.send_response(302)
                    self.send_header("Location", f"http://127.0.0.1:{servers.other.server_port}/m.onnx")
                    self.end_headers()
                    return
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_response(401)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(servers.model)))
                self.end_headers()
                self.wfile.write(servers.model)

            def log_message(self, *args: object) -> None:
                pass

        class Other(Model):
            def do_GET(self) -> None:
                servers.seen_by_other.append(self.headers.get("Authorization"))
                self.send_response(200)
                self.send_header("Content-Length", str(len(servers.model)))
                self.end_headers()
                self.wfile.write(servers.model)

        self.main = ThreadingHTTPServer(("127.0.0.1", 0), Model)
        self.other = ThreadingHTTPServer(("127.0.0.1", 0), Other)
        for s in (self.main, self.other):
            threading.Thread(target=s.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.main.server_port}{path}"

    def close(self) -> None:
        for s in (self.main, self.other):
            s.shutdown()
            s.server_close()


@pytest.fixture
def servers() -> Iterator[_Servers]:
    s = _Servers(dynamic_cnn().read_bytes())
    yield s
    s.close()


def test_token_from_the_secret_fetches_the_model(
    servers: _Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    fetched = fetch_model(servers.url("/m.onnx"), tmp_path, sha256_of(dynamic_cnn()))
    assert fetched.sha256 == sha256_of(dynamic_cnn())
    assert fetched.path.read_bytes() == servers.model


@pytest.mark.parametrize(("token", "says"), [(None, "no token given"), ("wrong", "the token was refused")])
def test_refusal_names_the_cause(
    servers: _Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, token: str | None, says: str
) -> None:
    if token is None:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, token)
    with pytest.raises(BuildError, match=f"HTTP 401 .*{says}") as e:
        fetch_model(servers.url("/m.onnx"), tmp_path)
    assert e.value.reason == "ModelFetchFailed"


def test_a_plain_http_source_follows_no_redirect(
    servers: _Servers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with pytest.raises(BuildError, match="plain-http source follows no redirects") as e:
        fetch_model(servers.url("/elsewhere.onnx"), tmp_path)
    assert e.value.reason == "ModelSourceRefused"
    assert servers.seen_by_other == []  # never asked, with or without the token


def test_build_without_the_token_fails_with_one_line_and_publishes_nothing(
    servers: _Servers, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    _, msg, _ = build(
        tmp_path,
        "--model",
        servers.url("/m.onnx"),
        "--gpu",
        "cpu",
        "--profile",
        PROFILE,
        "--store",
        str(store),
        env={TOKEN_ENV: ""},
    )
    assert msg.reason == "ModelFetchFailed" and "HTTP 401" in msg.error and TOKEN_ENV in msg.error
    assert nothing_published(store)
