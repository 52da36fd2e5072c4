"""Direct S3 reads (trtforge.store.s3_direct): when they stand in for boto3, their signature against
botocore's own signer, and S3Store reading through them from moto's server on a loopback port (and
from a server that breaks a body midway), compared with the same reads through boto3."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.utils import percent_encode

from tests.certs import self_signed
from trtforge.store import ObjectNotFound, StoreError
from trtforge.store.s3 import DIRECT_ENV, S3Store, make_client, s3_settings
from trtforge.store.s3_direct import (
    DirectTarget,
    direct_target,
    error_code,
    object_path,
    shared_config_exists,
    signed_headers,
)

CREDS = {
    "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
}
ENDPOINT = {**CREDS, "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1"}
BIG = hashlib.sha256(b"seed").digest() * (3 * (1 << 20) // 32 + 7)  # a bit over 3 MiB


def _target(
    settings: dict[str, str], env: dict[str, str] | None = None, bucket: str = "engines"
) -> DirectTarget:
    got = direct_target(settings, env if env is not None else settings, bucket, False)
    assert isinstance(got, DirectTarget), got
    return got


def test_an_endpoint_is_addressed_path_style_with_its_port_in_the_host_header() -> None:
    t = _target(ENDPOINT)
    assert (t.scheme, t.hostname, t.port, t.host, t.base, t.region) == (
        "http",
        "127.0.0.1",
        9000,
        "127.0.0.1:9000",
        "/engines",
        "eu-west-1",
    )
    assert _target({**ENDPOINT, "AWS_ENDPOINT_URL": "https://minio.example:443/"}).host == "minio.example"
    v6 = _target({**ENDPOINT, "AWS_ENDPOINT_URL": "http://[::1]:9000"})
    assert (v6.hostname, v6.host) == ("::1", "[::1]:9000")
    assert "wJalr" not in repr(t)  # the secret never shows


def test_aws_itself_is_addressed_at_the_buckets_regional_virtual_host() -> None:
    t = _target({**CREDS, "AWS_DEFAULT_REGION": "ap-southeast-2"})
    assert (t.scheme, t.host, t.base, t.region) == (
        "https",
        "engines.s3.ap-southeast-2.amazonaws.com",
        "",
        "ap-southeast-2",
    )
    assert _target(CREDS).region == "us-east-1"  # as make_client's default
    bundle = _target(CREDS, {**CREDS, "AWS_CA_BUNDLE": "/etc/ca.pem"})
    assert bundle.ca_file == "/etc/ca.pem"


@pytest.mark.parametrize(
    ("settings", "env", "bucket", "shared", "why"),
    [
        ({"AWS_REGION": "us-east-1"}, {}, "engines", False, "no static credentials"),
        (CREDS, {**CREDS, "AWS_PROFILE": "prod"}, "engines", False, "AWS_PROFILE set"),
        (CREDS, {**CREDS, "AWS_USE_FIPS_ENDPOINT": "true"}, "engines", False, "AWS_USE_FIPS_ENDPOINT set"),
        (CREDS, {**CREDS, "https_proxy": "http://proxy:3128"}, "engines", False, "https_proxy set"),
        (CREDS, CREDS, "engines", True, "shared AWS config file"),
        (
            {**CREDS, "AWS_ENDPOINT_URL": "http://minio:9000/base"},
            {},
            "engines",
            False,
            "http(s)://host[:port]",
        ),
        ({**CREDS, "AWS_ENDPOINT_URL": "ftp://minio"}, {}, "engines", False, "http(s)://host[:port]"),
        ({**CREDS, "AWS_ENDPOINT_URL": "http://u:hunter2@minio:9000/x"}, {}, "engines", False, "user name"),
        ({**CREDS, "AWS_ENDPOINT_URL": "http://minio:9000?x=1"}, {}, "engines", False, "beyond"),
        ({**CREDS, "AWS_REGION": "cn-north-1"}, {}, "engines", False, "outside the aws partition"),
        (CREDS, {}, "my.dotted.bucket", False, "not one DNS label"),
        (CREDS, {}, "models--usw2-az1--x-s3", False, "not one DNS label"),
    ],
)
def test_boto3_reads_whenever_a_direct_read_might_differ_and_says_why(
    settings: dict[str, str], env: dict[str, str], bucket: str, shared: bool, why: str
) -> None:
    got = direct_target(settings, env, bucket, shared)
    assert isinstance(got, str) and why in got
    assert "hunter2" not in got and CREDS["AWS_SECRET_ACCESS_KEY"] not in got  # it is logged


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        (ENDPOINT, "store/engines/" + "a" * 64 + "/model-0123.onnx"),
        ({**ENDPOINT, "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEXAMPLE"}, "store/engines/b/manifest.json"),
        ({**CREDS, "AWS_REGION": "eu-central-1"}, "pre fix/a+b=c/ü~x.onnx"),
        ({**CREDS, "AWS_ENDPOINT_URL": "https://[::1]:9443", "AWS_SESSION_TOKEN": "t"}, "k"),
    ],
)
def test_the_signature_is_botocores_for_the_same_request(settings: dict[str, str], key: str) -> None:
    """botocore's S3 SigV4 signer is the reference: same request, same time, same Authorization."""
    t = _target(settings)
    path = object_path(t, key)
    assert path == t.base + "/" + percent_encode(key, safe="/~")  # how botocore puts a key in a URI
    request = AWSRequest(method="GET", url=f"{t.scheme}://{t.host}{path}", headers={})
    creds = Credentials(t.access_key, t.secret_key, t.session_token)
    S3SigV4Auth(creds, "s3", t.region).add_auth(request)
    when = dt.datetime.strptime(request.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    ours = signed_headers(t, "GET", path, when, request.headers["X-Amz-Content-SHA256"])
    assert ours["authorization"] == request.headers["Authorization"]
    assert ours["x-amz-date"] == request.headers["X-Amz-Date"]
    if t.session_token:
        assert ours["x-amz-security-token"] == request.headers["X-Amz-Security-Token"]


def test_the_signature_changes_with_every_input() -> None:
    t = _target(ENDPOINT)
    now = dt.datetime(2026, 12, 5, 10, 0, tzinfo=dt.UTC)
    base = signed_headers(t, "GET", "/engines/a", now)["authorization"]
    changed = [
        signed_headers(t, "GET", "/engines/b", now),
        signed_headers(t, "HEAD", "/engines/a", now),
        signed_headers(t, "GET", "/engines/a", now + dt.timedelta(seconds=1)),
        signed_headers(_target({**ENDPOINT, "AWS_SECRET_ACCESS_KEY": "other"}), "GET", "/engines/a", now),
        signed_headers(_target({**ENDPOINT, "AWS_REGION": "us-west-2"}), "GET", "/engines/a", now),
    ]
    assert all(h["authorization"] != base for h in changed)


def test_error_codes_are_read_from_s3s_xml() -> None:
    body = b'<?xml version="1.0"?><Error><Code>NoSuchKey</Code><Message>gone</Message></Error>'
    assert error_code(body) == "NoSuchKey"
    assert error_code(b"<html>502 Bad Gateway</html>") == ""


def test_a_shared_config_file_is_found_under_home(tmp_path: Any) -> None:
    assert not shared_config_exists({"HOME": str(tmp_path)})
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text("[default]\n")
    assert shared_config_exists({"HOME": str(tmp_path)})


# --- against a real S3-compatible server ------------------------------------------------------


def _only_store_settings(monkeypatch: pytest.MonkeyPatch, settings: dict[str, str], home: Any) -> None:
    """The store's settings and nothing else that a direct read would refuse to stand in for."""
    import os

    for k in list(os.environ):
        if k.startswith("AWS_") or k.upper() in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.delenv(k)
    for k in ("TRTFORGE_S3_CREDENTIALS_DIR", DIRECT_ENV):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(home))
    for k, v in settings.items():
        monkeypatch.setenv(k, v)


@pytest.fixture
def bucket(
    s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, tmp_path: Any
) -> str:
    """A fresh bucket holding `big` and `small` under `p/`."""
    _only_store_settings(
        monkeypatch,
        {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_ENDPOINT_URL": s3_endpoint},
        tmp_path,
    )
    name = "d-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:12]
    client = make_client(s3_settings())
    client.create_bucket(Bucket=name)
    client.put_object(Bucket=name, Key="p/big", Body=BIG)
    client.put_object(Bucket=name, Key="p/small", Body=b"manifest")
    return name


def test_reads_are_direct_and_equal_boto3s(bucket: str) -> None:
    direct = S3Store(f"s3://{bucket}/p")
    via_boto3 = S3Store(f"s3://{bucket}/p", client=make_client(s3_settings()))
    assert direct.read_bytes("big") == via_boto3.read_bytes("big") == BIG
    chunks = list(direct.iter_chunks("big", 1 << 20))
    assert b"".join(chunks) == BIG and max(map(len, chunks)) == 1 << 20 and len(chunks) == 4
    assert direct.read_bytes("small") == b"manifest"
    for store in (direct, via_boto3):
        with pytest.raises(ObjectNotFound) as e:
            store.read_bytes("absent")
        assert str(e.value) == f"store s3://{bucket}/p (endpoint {store.endpoint}): absent does not exist"
    with pytest.raises(StoreError, match="is not a relative path of plain names"):
        direct.read_bytes("../escape")
    assert direct._client is None  # boto3 was never needed
    assert isinstance(direct._direct, DirectTarget)


def test_what_a_direct_read_cannot_begin_is_read_through_boto3_from_then_on(
    bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A bucket that does not exist answers 404 NoSuchBucket: not an object's absence, so boto3
    reads it and reports it as it always did."""
    store = S3Store("s3://no-such-bucket-here/p")
    with (
        caplog.at_level(logging.WARNING, logger="trtforge.store.s3"),
        pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist"),
    ):
        store.read_bytes("small")
    assert [r.getMessage() for r in caplog.records].count(
        "a direct S3 read could not begin; this store reads through boto3 from now on"
    ) == 1
    assert (
        store._client is not None and isinstance(store._direct, str) and "404 NoSuchBucket" in store._direct
    )


def test_the_switch_sends_every_read_through_boto3(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DIRECT_ENV, "0")
    store = S3Store(f"s3://{bucket}/p")
    assert store.read_bytes("small") == b"manifest"
    assert store._client is not None and store._direct == f"{DIRECT_ENV}=0"


def test_a_body_that_breaks_midway_is_a_store_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A server that announces 1000 bytes, sends 10 and closes: the read fails, naming the object."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            while b"\r\n\r\n" not in conn.recv(65536):
                pass
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    _only_store_settings(
        monkeypatch,
        {
            "AWS_ACCESS_KEY_ID": "t",
            "AWS_SECRET_ACCESS_KEY": "t",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        },
        tmp_path,
    )
    store = S3Store("s3://b/p")
    with pytest.raises(StoreError, match="read f failed: IncompleteRead"):
        b"".join(store.iter_chunks("f", 1 << 20))
    t.join()
    listener.close()
    assert store._client is None  # the read began directly; its failure is the read's


# --- TLS ---------------------------------------------------------------------------------------


def _self_signed(tmp: Any) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (and its key) that no public bundle trusts."""
    cert, key = self_signed(tmp)
    return str(cert), str(key)


@pytest.fixture
def tls_server(tmp_path: Any) -> Iterator[tuple[int, str, list[dict[str, str]]]]:
    """An HTTPS server on loopback answering every GET with b"tls-bytes"; (port, its certificate,
    the headers of each request it got)."""
    import http.server
    import ssl

    cert, key = _self_signed(tmp_path)
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"tls-bytes")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server.server_address[1], cert, seen
    server.shutdown()
    server.server_close()


def test_https_is_verified_against_the_bundle_boto3_would_trust(
    tls_server: tuple[int, str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    port, cert, seen = tls_server
    settings = {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_ENDPOINT_URL": f"https://127.0.0.1:{port}",
    }
    _only_store_settings(monkeypatch, {**settings, "AWS_CA_BUNDLE": cert}, tmp_path)
    store = S3Store("s3://b/p")
    assert store.read_bytes("f") == b"tls-bytes"
    assert store._client is None
    (got,) = seen
    assert got["host"] == f"127.0.0.1:{port}" and got["authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=t/"
    )


def test_https_with_a_certificate_nothing_vouches_for_is_refused(
    tls_server: tuple[int, str, list[dict[str, str]]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without AWS_CA_BUNDLE the certificate is checked against certifi's bundle, which does not
    hold it: the direct read does not begin, and boto3, which trusts the same bundle, refuses too."""
    port, _cert, seen = tls_server
    settings = {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_ENDPOINT_URL": f"https://127.0.0.1:{port}",
    }
    _only_store_settings(monkeypatch, settings, tmp_path)
    store = S3Store("s3://b/p")
    with caplog.at_level(logging.WARNING, logger="trtforge.store.s3"), pytest.raises(StoreError):
        store.read_bytes("f")
    assert not seen  # no request was ever answered
    assert isinstance(store._direct, str) and "SSLCertVerificationError" in store._direct
