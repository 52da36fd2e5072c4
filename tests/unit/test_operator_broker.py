"""The engine broker's HTTP surface (an aiohttp test server over a real local store) and its rules."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from trtforge_operator.broker import SHA256_HEADER, Denied, keys_referenced, make_app, namespace_of
from trtforge_operator.store_reader import StoreReader

from trtforge.contract.layout import engine_path, manifest_path
from trtforge.store import open_store

KEY = "e" * 64


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
        "model_sha256": "f" * 64,
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


async def _allow(token: str, key: str) -> str:
    if token != "good":
        raise Denied(401, "bad token")
    if key != KEY:
        raise Denied(403, "not yours")
    return "team-a/pod"


@pytest_asyncio.fixture
async def broker(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    """The broker app on a real local server, with `_allow` as its access rule."""
    async with TestClient(TestServer(make_app(_store(tmp_path), _allow))) as c:
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
