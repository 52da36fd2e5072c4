"""The engine broker's HTTP surface (an aiohttp test server over a real local store) and its rules."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from trtforge_operator.broker import (
    SHA256_HEADER,
    Denied,
    Identity,
    ModelSourceRef,
    UploaderPod,
    grant_denial,
    keys_referenced,
    make_app,
    namespace_of,
    upload_denial,
)
from trtforge_operator.store_reader import StoreReader

from trtforge.contract.layout import engine_path, manifest_path
from trtforge.contract.possession import (
    PossessionRecord,
    VerifyGrant,
    possession_path,
    source_fingerprint,
    staged_model_path,
    verify_grant_path,
)
from trtforge.store import open_store

KEY = "e" * 64


def _onnx_model() -> bytes:
    """A tiny ONNX model's bytes (the broker stores only well-formed ONNX for an onnx verification)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return bytes(model.SerializeToString())


MODEL = _onnx_model()
MODEL_SHA = hashlib.sha256(MODEL).hexdigest()
SOURCE = ModelSourceRef(uri="pvc://models/x.onnx", secret=None, pin=None)


def _store(tmp_path: Path) -> StoreReader:
    store = open_store(str(tmp_path))
    store.put_bytes(engine_path(KEY, "model-1.onnx"), b"engine-bytes")
    manifest = {
        "schema": "trtforge.io/manifest/v1",
        "key": KEY,
        "engine_file": "model-1.onnx",
        "sha256": "ab" * 32,
        "size_bytes": 12,
        "backend": "onnxruntime",
        "backend_version": "1",
        "cuda": "none",
        "gpu": {
            "product": "cpu",
            "compute_capability": "none",
            "mig_profile": "full",
            "sm_count": 0,
            "arch": "amd64",
        },
        "build": {},
        "model_uri": "pvc://m/x.onnx",
        "model_sha256": MODEL_SHA,
        "inputs": [],
        "outputs": [],
        "build_seconds": 1.0,
        "accuracy": {
            "samples": 1,
            "max_abs_error": 0,
            "max_rel_error": 0,
            "atol": 0,
            "rtol": 0,
            "passed": True,
        },
        "canary": {"file": "c.npz", "sha256": "c" * 64, "atol": 0, "rtol": 0},
    }
    import json

    store.commit(manifest_path(KEY), json.dumps(manifest).encode())
    return StoreReader(str(tmp_path))


class Tokens:
    """Tokens -> identities (the TokenReview stand-in), then the broker's real grant rule over the
    real store's possession records; team-a's and team-b's TRTEngines reference KEY through SOURCE."""

    def __init__(self, store: StoreReader) -> None:
        self.store = store

    async def identify(self, token: str) -> Identity:
        who = {"good": Identity("team-a", "pod"), "other": Identity("team-b", "pod")}.get(token)
        if who is None:
            raise Denied(401, "bad token")
        return who

    async def check_engine(self, who: Identity, key: str) -> None:
        sources = [SOURCE] if key == KEY else []
        why = grant_denial(who.namespace, key, sources, self.store.manifest(key), self.store.possession)
        if why:
            raise Denied(403, why)

    async def check_upload(self, who: Identity, sha256: str, length: int | None) -> VerifyGrant:
        """The broker's real upload rule over the real store's grants; every pod is VERIFY_POD."""
        grant = self.store.verify_grant(who.namespace, VERIFY_POD.job)
        why = upload_denial(who, VERIFY_POD, grant, sha256, length, time.time(), RUNNING_JOB)
        if why is not None:
            raise why
        assert grant is not None
        return grant


VERIFY_POD = UploaderPod(
    uid="",
    job="trtforge-verify-x",
    job_uid="job-uid",
    spec={"containers": [{"image": "img", "command": ["a"]}]},
)
RUNNING_JOB = {"metadata": {"uid": "job-uid"}, "status": {"active": 1}}


def _grant(tmp_path: Path, ns: str, pin: str = "", max_bytes: int = 1 << 20) -> None:
    g = VerifyGrant(
        namespace=ns,
        job=VERIFY_POD.job,
        job_uid=VERIFY_POD.job_uid,
        engine="e",
        fingerprint=source_fingerprint(SOURCE.uri, None, pin or None),
        uri=SOURCE.uri,
        pin=pin,
        max_bytes=max_bytes,
        image="img",
        command=["a"],
        expires_at=time.time() + 600,
    )
    open_store(str(tmp_path)).put_bytes(verify_grant_path(ns, g.job), g.to_json().encode())


def _prove(tmp_path: Path, ns: str = "team-a", sha: str = MODEL_SHA) -> None:
    rec = PossessionRecord(
        namespace=ns, fingerprint=SOURCE.fingerprint, sha256=sha, size_bytes=1, uri=SOURCE.uri
    )
    open_store(str(tmp_path)).put_bytes(possession_path(ns, SOURCE.fingerprint), rec.to_json().encode())


@pytest_asyncio.fixture
async def broker(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    """The broker app on a real local server over a real store; team-a has proven possession."""
    store = _store(tmp_path)
    _prove(tmp_path)
    async with TestClient(TestServer(make_app(store, Tokens(store), spool_dir=str(tmp_path)))) as c:
        yield c


@pytest.mark.asyncio
async def test_serves_an_engine_file_with_its_sha_to_an_allowed_token(broker: TestClient[Any, Any]) -> None:
    r = await broker.get(f"/engines/{KEY}/model-1.onnx", headers={"Authorization": "Bearer good"})
    assert r.status == 200 and await r.read() == b"engine-bytes"
    assert r.headers[SHA256_HEADER] == "ab" * 32
    h = await broker.head(f"/engines/{KEY}/model-1.onnx", headers={"Authorization": "Bearer good"})
    assert h.status == 200
    ls = await broker.get(f"/engines/{KEY}/", headers={"Authorization": "Bearer good"})
    assert (await ls.json())["files"] == ["manifest.json", "model-1.onnx"]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "headers,path,status",
    [
        ({}, f"/engines/{KEY}/model-1.onnx", 401),
        ({"Authorization": "Bearer bad"}, f"/engines/{KEY}/model-1.onnx", 401),
        ({"Authorization": "Bearer good"}, f"/engines/{'d' * 64}/model-1.onnx", 403),
        ({"Authorization": "Bearer good"}, f"/engines/{KEY}/nope.onnx", 404),
        ({"Authorization": "Bearer good"}, "/engines/not-a-key/model-1.onnx", 404),
    ],
)
async def test_refusals(
    broker: TestClient[Any, Any], headers: dict[str, str], path: str, status: int
) -> None:
    assert (await broker.get(path, headers=headers)).status == status


def test_only_keys_of_engines_an_inferencedeployment_references() -> None:
    infds = [{"spec": {"engineRef": {"name": "a"}}}]
    engines = {
        "a": {"status": {"targets": [{"engineKey": "1" * 64}, {"engineKey": "2" * 64}]}},
        "b": {"status": {"targets": [{"engineKey": "3" * 64}]}},  # no InferenceDeployment serves it
    }
    assert keys_referenced(infds, engines) == {"1" * 64, "2" * 64}
    assert namespace_of("system:serviceaccount:team-a:default") == "team-a"
    assert namespace_of("alice") is None


@pytest.mark.asyncio
async def test_an_engine_is_refused_to_a_namespace_that_has_not_proven_it_holds_the_model(
    broker: TestClient[Any, Any],
) -> None:
    r = await broker.get(f"/engines/{KEY}/model-1.onnx", headers={"Authorization": "Bearer other"})
    # team-a proved it; team-b references the same key but did not.
    assert r.status == 403 and "has not proven it holds the model" in (await r.json())["error"]


def test_a_record_of_another_digest_or_source_proves_nothing(tmp_path: Path) -> None:
    store = _store(tmp_path)
    _prove(tmp_path, sha="0" * 64)
    m = store.manifest(KEY)
    assert grant_denial("team-a", KEY, [SOURCE], m, store.possession) is not None
    moved = ModelSourceRef(uri="pvc://models/y.onnx", secret=None, pin=None)
    _prove(tmp_path)
    store.invalidate_possession("team-a", SOURCE.fingerprint)  # the broker does this when it records
    assert grant_denial("team-a", KEY, [SOURCE], m, store.possession) is None
    assert grant_denial("team-a", KEY, [moved], m, store.possession) is not None
    assert "no InferenceDeployment" in (grant_denial("team-a", KEY, [], m, store.possession) or "")


@pytest.mark.asyncio
async def test_a_verify_upload_is_hashed_by_the_broker_staged_once_and_recorded(
    broker: TestClient[Any, Any], tmp_path: Path
) -> None:
    fp = source_fingerprint(SOURCE.uri, None, None)
    hdr = {"Authorization": "Bearer other"}
    store = open_store(str(tmp_path))
    # No pending verification for team-b: refused, nothing written.
    none = await broker.put(f"/models/{MODEL_SHA}", data=MODEL, headers=hdr)
    assert none.status == 403 and not store.exists(staged_model_path(MODEL_SHA))
    # A pinned verification takes no other digest.
    _grant(tmp_path, "team-b", pin="1" * 64)
    pinned = await broker.put(f"/models/{MODEL_SHA}", data=MODEL, headers=hdr)
    assert pinned.status == 403 and not store.exists(staged_model_path(MODEL_SHA))
    _grant(tmp_path, "team-b")
    # Bytes that are not the digest named: refused, nothing recorded or staged.
    bad = await broker.put(f"/models/{MODEL_SHA}", data=b"something else", headers=hdr)
    assert bad.status == 422 and "nothing was recorded" in (await bad.json())["error"]
    assert not store.exists(possession_path("team-b", fp)) and not store.exists(staged_model_path(MODEL_SHA))
    no_token = await broker.put(f"/models/{MODEL_SHA}", data=MODEL)
    assert no_token.status == 401
    ok = await broker.put(f"/models/{MODEL_SHA}", data=MODEL, headers=hdr)
    assert ok.status == 200 and (await ok.json())["fingerprint"] == fp
    # team-b now holds the model: the engine is served to it.
    r = await broker.get(f"/engines/{KEY}/model-1.onnx", headers={"Authorization": "Bearer other"})
    assert r.status == 200
    assert store.read_bytes(staged_model_path(MODEL_SHA)) == MODEL
    rec = PossessionRecord.from_json(store.read_bytes(possession_path("team-b", fp)))
    assert (rec.namespace, rec.sha256, rec.pod, rec.uri) == ("team-b", MODEL_SHA, "pod", SOURCE.uri)
    # The grant is used up: the same Job's pod records nothing more.
    again = await broker.put(f"/models/{MODEL_SHA}", data=MODEL, headers=hdr)
    assert again.status == 403
