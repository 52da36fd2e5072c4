"""The S3 store against moto's S3-compatible server on a loopback port, over HTTP, with boto3."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import threading
from pathlib import Path

import pytest

from trtforge.contract import layout
from trtforge.store import IntegrityError, ObjectNotFound, StoreError, open_store
from trtforge.store.s3 import S3Store, make_client, s3_settings

KEY = "b" * 64
ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """A fresh bucket; the store's settings in the environment. Returns the bucket name."""
    for k, v in {**ENV, "AWS_ENDPOINT_URL": s3_endpoint}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TRTFORGE_S3_CREDENTIALS_DIR", raising=False)
    monkeypatch.delenv("TRTFORGE_S3_CONDITIONAL_WRITES", raising=False)
    bucket = "t-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:12]
    make_client(s3_settings()).create_bucket(Bucket=bucket)
    return bucket


def test_put_get_list_delete(s3_env: str) -> None:
    store = open_store(f"s3://{s3_env}/some/prefix")
    assert isinstance(store, S3Store)
    small = b"manifest"
    assert store.put_bytes(layout.manifest_path(KEY), small).sha256 == hashlib.sha256(small).hexdigest()
    assert store.read_bytes(layout.manifest_path(KEY)) == small
    assert store.list("engines/") == [layout.manifest_path(KEY)]
    assert store.exists(layout.manifest_path(KEY)) and not store.exists(layout.engine_path(KEY, "x"))
    with pytest.raises(ObjectNotFound, match="does not exist"):
        store.read_bytes(layout.engine_path(KEY, "x"))
    with pytest.raises(IntegrityError):
        store.get(layout.manifest_path(KEY), io.BytesIO(), expected_sha256="0" * 64)
    store.delete(layout.manifest_path(KEY))
    assert store.list("") == []


def test_multipart_streamed_and_verified(s3_env: str) -> None:
    store = S3Store(f"s3://{s3_env}/p", part_size=5 << 20)
    data = os.urandom(11 << 20)  # three parts
    res = store.put(layout.engine_path(KEY, "engine.plan"), io.BytesIO(data))
    assert res.size_bytes == len(data) and res.sha256 == hashlib.sha256(data).hexdigest()
    out = io.BytesIO()
    store.get(layout.engine_path(KEY, "engine.plan"), out, expected_sha256=res.sha256)
    assert out.getvalue() == data
    # no multipart uploads left behind
    assert not store.client.list_multipart_uploads(Bucket=s3_env).get("Uploads")


def test_failed_upload_is_aborted_and_invisible(s3_env: str) -> None:
    store = S3Store(f"s3://{s3_env}/p", part_size=5 << 20)

    class Breaks(io.RawIOBase):
        sent = 0

        def read(self, n: int = -1) -> bytes:
            if self.sent >= 6 << 20:
                raise OSError("the source died")
            self.sent += n
            return b"x" * n

    with pytest.raises(StoreError, match="the source died"):
        store.put(layout.engine_path(KEY, "engine.plan"), Breaks())  # type: ignore[arg-type]
    assert not store.exists(layout.engine_path(KEY, "engine.plan"))
    assert not store.client.list_multipart_uploads(Bucket=s3_env).get("Uploads")


def test_a_commit_that_finds_the_object_there_loses_and_never_overwrites(s3_env: str) -> None:
    """The conditional create (If-None-Match: *): the first commit wins; every later one, from any
    store, concurrently or not, is told it lost and leaves the winner's bytes. Which of several
    commits racing within one round trip wins is the S3 server's atomic check; moto's server runs that
    check and the write as two steps on its own threads, so the race itself is not what this tests."""
    uri = f"s3://{s3_env}/race"
    assert open_store(uri).commit(layout.manifest_path(KEY), b"w0")
    results: dict[int, bool] = {}
    barrier = threading.Barrier(3)

    def racer(n: int) -> None:
        store = open_store(uri)
        barrier.wait()
        results[n] = store.commit(layout.manifest_path(KEY), f"w{n}".encode())

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {1: False, 2: False, 3: False}
    store = open_store(uri)
    assert store.read_bytes(layout.manifest_path(KEY)) == b"w0"
    assert store.conditional_writes  # lost on the server's 412, not by falling back to HEAD then PUT


def test_commit_without_conditional_writes(s3_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTFORGE_S3_CONDITIONAL_WRITES", "0")
    store = open_store(f"s3://{s3_env}/p")
    assert store.commit(layout.manifest_path(KEY), b"a") is True
    assert store.commit(layout.manifest_path(KEY), b"b") is False
    assert store.read_bytes(layout.manifest_path(KEY)) == b"a"


def test_credentials_from_a_mounted_secret(
    s3_env: str, s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k)
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("test\n")
    (tmp_path / "AWS_SECRET_ACCESS_KEY").write_text("test")
    (tmp_path / "AWS_ENDPOINT_URL").write_text(s3_endpoint)
    monkeypatch.setenv("TRTFORGE_S3_CREDENTIALS_DIR", str(tmp_path))
    store = open_store(f"s3://{s3_env}")
    store.put_bytes("x", b"1")
    assert store.read_bytes("x") == b"1"


def test_unreachable_endpoint_names_uri_and_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    for k, v in {**ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}.items():
        monkeypatch.setenv(k, v)
    store = open_store("s3://bucket/prefix")
    with pytest.raises(StoreError) as e:
        store.exists(layout.manifest_path(KEY))
    msg = str(e.value)
    assert "s3://bucket/prefix" in msg and f"127.0.0.1:{port}" in msg and "cannot reach" in msg


def test_missing_bucket(s3_env: str) -> None:
    store = open_store("s3://no-such-bucket-here/p")
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist"):
        store.put_bytes("x", b"1")
