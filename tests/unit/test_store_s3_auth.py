"""The S3 store's requests as a server that checks them sees them: moto's server in its own process
with IAM authentication on (every request's Signature Version 4 checked against the access key's
secret, and its action against the identity's policies). Credentials from the store's settings and
from botocore's chain (a profile in a shared credentials file, web identity as IRSA gives a pod),
and the errors a store user gets when they are missing or wrong. Also a body that breaks midway,
TLS against the CA bundle botocore trusts, and the messages of errors moto does not produce
(:func:`~trtforge.store.s3.describe_error`, pure)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.certs import self_signed
from trtforge.store import IntegrityError, ObjectNotFound, StoreError
from trtforge.store.s3 import S3Store, describe_error

BUCKET = "engines"
BIG = hashlib.sha256(b"seed").digest() * (6 * (1 << 20) // 32 + 7)  # a bit over 6 MiB: two parts
ROLE_ARN = "arn:aws:iam::123456789012:role/engine-reader"
ALLOW_ALL_S3 = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}
ALLOW_READ = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"], "Resource": "*"}],
}
TRUST_WEB_IDENTITY = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Federated": "arn:aws:iam::123456789012:oidc-provider/oidc.example"},
            "Action": "sts:AssumeRoleWithWebIdentity",
        }
    ],
}

# moto's server, except that AssumeRoleWithWebIdentity needs no signature once authentication is on:
# AWS does not sign that call (the web identity token is its credential), moto asks every action for one.
MOTO_SERVER = r"""
import sys
from moto.core.authorization import ActionAuthenticatorMixin
from moto.server import main

signed = ActionAuthenticatorMixin._authenticate_and_authorize_normal_action

def checked(self, resource="*"):
    if self._get_action() != "AssumeRoleWithWebIdentity":
        signed(self, resource)

ActionAuthenticatorMixin._authenticate_and_authorize_normal_action = checked
main(sys.argv[1:])
"""


@dataclass(frozen=True)
class AuthS3:
    url: str
    access_key: str
    secret_key: str


def _wait_up(url: str, proc: subprocess.Popen[bytes]) -> None:
    from trtforge_dev.testbed.wait import wait_for

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode}")
        urllib.request.urlopen(url + "/moto-api/", timeout=5).close()
        return True

    wait_for(up, desc=f"moto_server at {url}", ignore=(OSError,))


@pytest.fixture(scope="module")
def auth_s3() -> Iterator[AuthS3]:
    """moto's server with IAM authentication on, in a process of its own (the switch is global to a
    moto process); a user whose key may do anything in S3, a role that web identities may assume
    and that may only read, and the bucket with `p/big` and `p/small`."""
    import boto3
    from trtforge_dev.testbed.procs import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_up(url, proc)
        session = boto3.session.Session(
            aws_access_key_id="setup", aws_secret_access_key="setup", region_name="us-east-1"
        )
        iam = session.client("iam", endpoint_url=url)
        iam.create_user(UserName="store")
        iam.put_user_policy(UserName="store", PolicyName="s3", PolicyDocument=json.dumps(ALLOW_ALL_S3))
        key = iam.create_access_key(UserName="store")["AccessKey"]
        iam.create_role(RoleName="engine-reader", AssumeRolePolicyDocument=json.dumps(TRUST_WEB_IDENTITY))
        iam.put_role_policy(
            RoleName="engine-reader", PolicyName="read", PolicyDocument=json.dumps(ALLOW_READ)
        )
        s3 = session.client("s3", endpoint_url=url)
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="p/big", Body=BIG)
        s3.put_object(Bucket=BUCKET, Key="p/small", Body=b"manifest")
        # From here on every request must carry a valid signature by a key moto knows.
        on = urllib.request.Request(url + "/moto-api/reset-auth", b"0", {"Content-Type": "text/plain"})
        urllib.request.urlopen(on).close()
        yield AuthS3(url, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str]) -> None:
    """The environment holds `env` and no other AWS setting, no shared AWS file and no instance
    metadata service to ask."""
    for k in list(os.environ):
        if k.startswith("AWS_") or k.upper() in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.delenv(k)
    monkeypatch.delenv("TRTFORGE_S3_CREDENTIALS_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    for k, v in env.items():
        monkeypatch.setenv(k, v)


def _keys(s3: AuthS3, **over: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": s3.url,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": "us-east-1",
        **over,
    }


def test_every_operation_is_signed_as_a_checking_server_accepts(
    auth_s3: AuthS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    _only(monkeypatch, tmp_path, _keys(auth_s3))
    prefix = "w-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:8]
    store = S3Store(f"s3://{BUCKET}/{prefix}", part_size=5 << 20)
    res = store.put("engine.plan", io.BytesIO(BIG))  # multipart: create, two parts, complete
    assert res.sha256 == hashlib.sha256(BIG).hexdigest()
    out = io.BytesIO()
    store.get("engine.plan", out, expected_sha256=res.sha256)
    assert out.getvalue() == BIG
    with pytest.raises(IntegrityError):
        store.get("engine.plan", io.BytesIO(), expected_sha256="0" * 64)
    assert store.commit("manifest.json", b"m") is True and store.commit("manifest.json", b"n") is False
    assert store.list("") == ["engine.plan", "manifest.json"]
    assert store.exists("manifest.json") and not store.exists("absent")
    with pytest.raises(ObjectNotFound, match=f"s3://{BUCKET}/{prefix} .*: absent does not exist"):
        store.read_bytes("absent")
    store.delete("engine.plan")
    assert store.list("") == ["manifest.json"]
    chunks = list(S3Store(f"s3://{BUCKET}/p").iter_chunks("big", 1 << 20))
    assert b"".join(chunks) == BIG and max(map(len, chunks)) == 1 << 20


def test_a_wrong_secret_is_refused_and_the_error_says_which_setting(
    auth_s3: AuthS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    wrong = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
    _only(monkeypatch, tmp_path, _keys(auth_s3, AWS_SECRET_ACCESS_KEY=wrong))
    store = S3Store(f"s3://{BUCKET}/p")
    with pytest.raises(StoreError) as e:
        store.read_bytes("small")
    msg = str(e.value)
    assert f"store s3://{BUCKET}/p (endpoint {auth_s3.url})" in msg and "read small" in msg
    assert "refused the request's signature" in msg and "AWS_SECRET_ACCESS_KEY" in msg
    assert wrong not in msg and auth_s3.secret_key not in msg
    with pytest.raises(StoreError, match="refused the request's signature"):
        store.put_bytes("x", b"1")


def test_an_unknown_access_key_is_named_as_such(
    auth_s3: AuthS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _only(monkeypatch, tmp_path, _keys(auth_s3, AWS_ACCESS_KEY_ID="AKIANOTKNOWNHERE0000"))
    with pytest.raises(StoreError, match=r"does not know the access key \(read small: InvalidAccessKeyId\)"):
        S3Store(f"s3://{BUCKET}/p").read_bytes("small")


def test_no_credentials_anywhere_is_a_clear_error(
    auth_s3: AuthS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _only(monkeypatch, tmp_path, {"AWS_ENDPOINT_URL": auth_s3.url})
    with pytest.raises(StoreError) as e:
        S3Store(f"s3://{BUCKET}/p").read_bytes("small")
    msg = str(e.value)
    assert msg.startswith(f"store s3://{BUCKET}/p (endpoint {auth_s3.url}): no S3 credentials to read small;")
    assert "AWS_ACCESS_KEY_ID" in msg and "TRTFORGE_S3_CREDENTIALS_DIR" in msg and "IRSA" in msg


def test_a_key_without_its_secret_is_a_clear_error(
    auth_s3: AuthS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _only(monkeypatch, tmp_path, {"AWS_ENDPOINT_URL": auth_s3.url, "AWS_ACCESS_KEY_ID": auth_s3.access_key})
    with pytest.raises(StoreError, match=r"no S3 credentials to read small \(.*aws_secret_access_key"):
        S3Store(f"s3://{BUCKET}/p").read_bytes("small")


def test_credentials_from_a_profile_in_a_shared_credentials_file(
    auth_s3: AuthS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    creds = tmp_path / "credentials"
    creds.write_text(
        f"[engines]\naws_access_key_id = {auth_s3.access_key}\naws_secret_access_key = {auth_s3.secret_key}\n"
    )
    _only(monkeypatch, tmp_path, {"AWS_ENDPOINT_URL": auth_s3.url, "AWS_PROFILE": "engines"})
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    assert S3Store(f"s3://{BUCKET}/p").read_bytes("small") == b"manifest"


def test_credentials_from_a_web_identity_as_irsa_gives_a_pod(
    auth_s3: AuthS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """EKS's IRSA sets AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE; botocore trades the token for
    the role's temporary credentials (STS at the same endpoint here). The role may only read: a
    write is refused, and the error names the permission it needs. Nothing secret is logged, even
    with every logger at DEBUG."""
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZW5naW5lcyJ9.c2ln")
    _only(
        monkeypatch,
        tmp_path,
        {
            "AWS_ENDPOINT_URL": auth_s3.url,  # botocore sends STS there too
            "AWS_ROLE_ARN": ROLE_ARN,
            "AWS_WEB_IDENTITY_TOKEN_FILE": str(token),
            "AWS_REGION": "us-east-1",
        },
    )
    caplog.set_level(logging.DEBUG)
    store = S3Store(f"s3://{BUCKET}/p")
    assert store.read_bytes("big") == BIG
    with pytest.raises(StoreError) as e:
        store.put_bytes("x", b"1")
    assert "access denied to write x (AccessDenied); grant the store's identity s3:PutObject" in str(e.value)
    frozen = store.client._request_signer._credentials.get_frozen_credentials()  # type: ignore[attr-defined]
    assert frozen.token and frozen.access_key != auth_s3.access_key  # the role's, from STS
    logged = caplog.text + "".join(str(r.__dict__) for r in caplog.records)
    assert frozen.token not in logged and frozen.secret_key not in logged
    assert token.read_text() not in logged


def test_a_body_that_breaks_midway_is_a_store_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
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
    _only(
        monkeypatch,
        tmp_path,
        {
            "AWS_ACCESS_KEY_ID": "t",
            "AWS_SECRET_ACCESS_KEY": "t",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        },
    )
    with pytest.raises(StoreError, match="read f failed: IncompleteReadError"):
        b"".join(S3Store("s3://b/p").iter_chunks("f", 1 << 20))
    t.join()
    listener.close()


# --- TLS ---------------------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, str, list[dict[str, str]]]]:
    """An HTTPS server on loopback answering every GET with b"tls-bytes"; (port, its certificate,
    the headers of each request it got)."""
    import http.server
    import ssl

    cert, key = self_signed(tmp_path)
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
    yield server.server_address[1], str(cert), seen
    server.shutdown()
    server.server_close()


def test_https_is_verified_against_aws_ca_bundle(
    tls_server: tuple[int, str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    port, cert, seen = tls_server
    endpoint = f"https://127.0.0.1:{port}"
    _only(
        monkeypatch,
        tmp_path,
        {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_ENDPOINT_URL": endpoint},
    )
    with pytest.raises(StoreError) as e:
        S3Store("s3://b/p").read_bytes("f")
    assert "TLS certificate is not trusted (read f)" in str(e.value) and "AWS_CA_BUNDLE" in str(e.value)
    assert not seen  # no request was ever answered
    monkeypatch.setenv("AWS_CA_BUNDLE", cert)
    assert S3Store("s3://b/p").read_bytes("f") == b"tls-bytes"
    (got,) = seen
    assert got["host"] == f"127.0.0.1:{port}" and got["authorization"].startswith(
        "AWS4-HMAC-SHA256 Credential=t/"
    )


# --- messages of errors the servers here do not produce (describe_error is pure) --------------


def _client_error(status: int, code: str, message: str = "", **extra: str) -> ClientError:
    error = {"Code": code, "Message": message, **extra}
    meta = {"HTTPStatusCode": status, "HTTPHeaders": {}}
    return ClientError({"Error": error, "ResponseMetadata": meta}, "GetObject")  # type: ignore[typeddict-item]


@pytest.mark.parametrize(
    ("error", "region", "expected"),
    [
        (
            _client_error(
                400,
                "AuthorizationHeaderMalformed",
                "the region 'us-east-1' is wrong; expecting 'eu-west-1'",
                Region="eu-west-1",
            ),
            "us-east-1",
            "bucket 'engines' is not in region us-east-1 (read a/b: AuthorizationHeaderMalformed the region "
            "'us-east-1' is wrong; expecting 'eu-west-1'); set AWS_REGION=eu-west-1",
        ),
        (
            _client_error(301, "301"),
            None,
            "bucket 'engines' is not in region us-east-1 (read a/b: 301); set AWS_REGION to the bucket's "
            "region",
        ),
        (_client_error(403, "AccessDenied", "Access Denied"), "us-east-1", "s3:GetObject on s3://engines/*"),
        (_client_error(403, "403"), "us-east-1", "access denied to read a/b (403)"),
        (
            _client_error(400, "ExpiredToken", "The provided token has expired."),
            None,
            "renew AWS_SESSION_TOKEN",
        ),
        (_client_error(404, "NoSuchBucket"), None, "bucket 'engines' does not exist (read a/b)"),
        (
            _client_error(503, "SlowDown", "Please reduce your request rate."),
            None,
            "read a/b failed: SlowDown",
        ),
    ],
)
def test_each_refusal_says_what_to_do(error: ClientError, region: str | None, expected: str) -> None:
    got = describe_error("store s3://engines/p (endpoint AWS S3)", "engines", region, "read", "a/b", error)
    assert type(got) is StoreError and expected in str(got), str(got)
    assert str(got).startswith("store s3://engines/p (endpoint AWS S3): ")


def test_an_absent_object_is_object_not_found() -> None:
    got = describe_error(
        "store s3://e/p (endpoint x)", "e", None, "read", "a", _client_error(404, "NoSuchKey")
    )
    assert isinstance(got, ObjectNotFound) and str(got) == "store s3://e/p (endpoint x): a does not exist"
