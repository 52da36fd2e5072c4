"""The engine broker serves LLM artefacts (checkpoints, tuning caches) under the rules of engines: a
namespace reads only what an InferenceDeployment of its own references through a TRTEngine's status,
and only once it proved it holds the source model. The rules are pure functions; the HTTP surface
runs on a real aiohttp server over a real store, with those rules fed from the store's records."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from trtforge_operator.broker import Denied, Identity, make_app
from trtforge_operator.broker.server import (
    ModelSourceRef,
    artefact_denial,
    artefact_model_digest,
    artefact_sources,
)
from trtforge_operator.store_reader import StoreReader

from tests.llm_artefacts import checkpoint_manifest, tuning_manifest
from trtforge.contract.llm import (
    TUNING_RECORD,
    ArtefactFile,
    ArtefactKind,
    ArtefactManifest,
    Backend,
    SourceRef,
    TuningRecord,
    file_path,
    manifest_path,
)
from trtforge.contract.possession import PossessionRecord, possession_path
from trtforge.store import artefacts as art
from trtforge.store import open_store

SOURCE_SHA = "d" * 64
CKPT, TUNING = "c" * 64, "e" * 64
SRC = ModelSourceRef(uri="pvc://models/smollm2.gguf", secret=None, pin=SOURCE_SHA)
OURS, THEIRS = "team-a", "team-b"


def _engine(name: str, ckpt: str | None, tuning: str | None) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"llm": {"source": {"uri": SRC.uri, "sha256": SOURCE_SHA}, "recipe": "bf16"}},
        "status": {
            "checkpoint": {"phase": "Ready", "checkpointKey": ckpt} if ckpt else None,
            "targets": [{"name": "cpu", "engineKey": ckpt, "tuningKey": tuning}],
        },
    }


def _infd(engine: str) -> dict[str, Any]:
    return {"metadata": {"name": "chat"}, "spec": {"engineRef": {"name": engine}}}


def test_the_artefacts_a_referenced_llm_engine_names_carry_its_llm_source() -> None:
    engines = {"smollm2": _engine("smollm2", CKPT, TUNING), "other": _engine("other", "0" * 64, None)}
    refs = artefact_sources([_infd("smollm2")], engines)
    assert refs == {(ArtefactKind.CHECKPOINT, CKPT): [SRC], (ArtefactKind.TUNING_CACHE, TUNING): [SRC]}
    assert artefact_sources([], engines) == {}  # an engine no deployment references serves nothing
    onnx = {"r": {"metadata": {"name": "r"}, "spec": {"model": {"uri": "x"}}, "status": {"targets": []}}}
    assert artefact_sources([_infd("r")], onnx) == {}


def _record(ns: str, sha: str = SOURCE_SHA) -> PossessionRecord:
    return PossessionRecord(namespace=ns, fingerprint=SRC.fingerprint, sha256=sha, size_bytes=1, uri=SRC.uri)


def test_an_artefact_is_denied_without_a_reference_or_a_proof_of_the_source() -> None:
    proven = {(OURS, SRC.fingerprint): _record(OURS)}

    def look(ns: str, fp: str) -> PossessionRecord | None:
        return proven.get((ns, fp))

    kind = ArtefactKind.CHECKPOINT
    assert artefact_denial(OURS, kind, CKPT, [SRC], SOURCE_SHA, look) is None
    no_ref = artefact_denial(OURS, kind, CKPT, [], SOURCE_SHA, look)
    assert no_ref is not None and "no InferenceDeployment serving checkpoint" in no_ref
    unproven = artefact_denial(THEIRS, kind, CKPT, [SRC], SOURCE_SHA, look)
    assert unproven is not None and "has not proven it holds the model" in unproven
    # a proof of another model through the same source proves nothing about this checkpoint
    other = artefact_denial(OURS, kind, CKPT, [SRC], "9" * 64, look)
    assert other is not None and "has not proven" in other
    assert artefact_denial(OURS, kind, CKPT, [SRC], None, look) is None  # nothing there: the caller 404s


def _checkpoint_manifest(upload: str, files: list[ArtefactFile]) -> ArtefactManifest:
    return checkpoint_manifest(CKPT, SourceRef(uri=SRC.uri, digest=SOURCE_SHA), files, upload=upload)


def _tuning_manifest(upload: str, files: list[ArtefactFile]) -> ArtefactManifest:
    record = TuningRecord(
        backend=Backend.LLAMA_CPP, backend_version="test", gpu_product="cpu", checkpoint_key=CKPT, settings={}
    )
    return tuning_manifest(TUNING, record, files, upload=upload)


def test_a_tuning_cache_is_held_to_the_source_of_the_checkpoint_its_record_names() -> None:
    ck = _checkpoint_manifest("0" * 16, [])
    tu = _tuning_manifest("1" * 16, [])
    assert artefact_model_digest(ck, lambda _: None) == SOURCE_SHA
    assert artefact_model_digest(tu, lambda k: ck if k == CKPT else None) == SOURCE_SHA
    assert artefact_model_digest(tu, lambda _: None) is None  # its checkpoint is gone
    assert artefact_model_digest(None, lambda _: ck) is None


class RulesOverStore:
    """`team-a` references the checkpoint and tuning cache; the proofs are the real store's records."""

    def __init__(
        self, store: StoreReader, refs: dict[tuple[ArtefactKind, str], list[ModelSourceRef]]
    ) -> None:
        self.store, self.refs = store, refs

    async def identify(self, token: str) -> Identity:
        return Identity(token)

    async def check_engine(self, who: Identity, key: str) -> None:
        raise Denied(403, "no engines here")

    async def check_artefact(self, who: Identity, kind: ArtefactKind, key: str) -> None:
        digest = artefact_model_digest(
            self.store.artefact_manifest(kind, key),
            lambda k: self.store.artefact_manifest(ArtefactKind.CHECKPOINT, k),
        )
        why = artefact_denial(
            who.namespace,
            kind,
            key,
            self.refs.get((kind, key), []) if who.namespace == OURS else [],
            digest,
            self.store.possession,
        )
        if why is not None:
            raise Denied(403, why)

    async def check_upload(self, who: Identity, sha256: str, length: int | None) -> Any:
        raise Denied(403, "no uploads here")


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, ArtefactManifest, ArtefactManifest]:
    root = tmp_path / "store"
    store = open_store(str(root))
    ck_src = tmp_path / "ck"
    (ck_src / "sub").mkdir(parents=True)
    (ck_src / "model.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4096)  # 1 MiB and then some
    (ck_src / "sub" / "config.json").write_text("{}")
    ck, _ = art.publish(store, ArtefactKind.CHECKPOINT, CKPT, ck_src, _checkpoint_manifest)
    tu_src = tmp_path / "tu"
    tu_src.mkdir()
    (tu_src / TUNING_RECORD).write_text("{}")
    tu, _ = art.publish(store, ArtefactKind.TUNING_CACHE, TUNING, tu_src, _tuning_manifest)
    store.put_bytes(possession_path(OURS, SRC.fingerprint), _record(OURS).to_json().encode())
    # a loser's upload beside the winner's: nothing names it, nothing serves it
    store.put_bytes(file_path(ArtefactKind.CHECKPOINT, CKPT, "f" * 16, "model.gguf"), b"garbage")
    return root, ck, tu


@pytest_asyncio.fixture
async def broker(
    published: tuple[Path, ArtefactManifest, ArtefactManifest],
) -> AsyncIterator[TestClient[Any, Any]]:
    root, _, _ = published
    store = StoreReader(str(root))
    refs = {(ArtefactKind.CHECKPOINT, CKPT): [SRC], (ArtefactKind.TUNING_CACHE, TUNING): [SRC]}
    async with TestClient(TestServer(make_app(store, RulesOverStore(store, refs)))) as c:
        yield c


def _as(ns: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {ns}"}


@pytest.mark.asyncio
async def test_the_broker_streams_a_checkpoint_and_a_tuning_cache_file_by_file(
    broker: TestClient[Any, Any], published: tuple[Path, ArtefactManifest, ArtefactManifest]
) -> None:
    _, ck, tu = published
    r = await broker.get(f"/{manifest_path(ArtefactKind.CHECKPOINT, CKPT)}", headers=_as(OURS))
    assert r.status == 200
    assert ArtefactManifest.from_json(await r.read()) == ck
    for f in ck.files:
        r = await broker.get(
            f"/{file_path(ArtefactKind.CHECKPOINT, CKPT, ck.upload, f.path)}", headers=_as(OURS)
        )
        body = await r.read()
        assert r.status == 200 and r.headers["X-Trtforge-Sha256"] == f.sha256
        assert hashlib.sha256(body).hexdigest() == f.sha256 and len(body) == f.size
    head = await broker.head(
        f"/{file_path(ArtefactKind.TUNING_CACHE, TUNING, tu.upload, TUNING_RECORD)}", headers=_as(OURS)
    )
    assert head.status == 200
    r = await broker.get(f"/{manifest_path(ArtefactKind.TUNING_CACHE, TUNING)}", headers=_as(OURS))
    assert r.status == 200 and ArtefactManifest.from_json(await r.read()).tuning is not None


@pytest.mark.asyncio
async def test_only_the_files_the_manifest_lists_are_served_and_only_to_the_referencing_namespace(
    broker: TestClient[Any, Any], published: tuple[Path, ArtefactManifest, ArtefactManifest]
) -> None:
    _, ck, _ = published
    model = f"/{file_path(ArtefactKind.CHECKPOINT, CKPT, ck.upload, 'model.gguf')}"
    r = await broker.get(model, headers=_as(THEIRS))
    assert r.status == 403 and "no InferenceDeployment serving checkpoint" in (await r.json())["error"]
    loser = f"/{file_path(ArtefactKind.CHECKPOINT, CKPT, 'f' * 16, 'model.gguf')}"
    assert (await broker.get(loser, headers=_as(OURS))).status == 404
    unlisted = f"/{file_path(ArtefactKind.CHECKPOINT, CKPT, ck.upload, 'other.bin')}"
    assert (await broker.get(unlisted, headers=_as(OURS))).status == 404
    absent = f"/{manifest_path(ArtefactKind.CHECKPOINT, '7' * 64)}"
    assert (await broker.get(absent, headers=_as(OURS))).status == 403  # not referenced: says nothing more
    assert (await broker.get(f"/rank-engines/{CKPT}/manifest.json", headers=_as(OURS))).status == 404
    assert (await broker.get(f"/checkpoints/{CKPT}/../possession/x", headers=_as(OURS))).status == 404
