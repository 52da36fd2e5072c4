"""A cache hit is never taken on the manifest alone: `trtforge build` over a corrupted store entry
rebuilds it (and says why) or exits with StoreIntegrity; it never reports `cacheHit: true`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from trtforge_builder.errors import BuildError
from trtforge_builder.pipeline import run_build
from trtforge_builder.request import BuildRequest, make_build_config, parse_profiles
from trtforge_dev.modelzoo import dynamic_cnn, sha256_of

from trtforge.contract import layout
from trtforge.contract.build_result import BUILD_EXIT_CODES
from trtforge.contract.gpu import GPUTarget
from trtforge.contract.manifest import Manifest

PROFILE = ["images:1x3x16x16:2x3x16x16:4x3x16x16"]


@pytest.fixture(autouse=True)
def _threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTFORGE_ORT_THREADS", "2")
    monkeypatch.setenv("TRTFORGE_GPU_PROBE", "none")


def _request(model: Path, store: Path, **kw: object) -> BuildRequest:
    return BuildRequest(
        model_uri=str(model),
        target=GPUTarget(gpu="cpu"),
        build=make_build_config(precision="fp32", profiles=parse_profiles(PROFILE)),
        store_uri=str(store),
        samples=2,
        **kw,  # type: ignore[arg-type]
    )


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-7])


CORRUPTIONS: dict[str, Callable[[Path, Manifest], None]] = {
    "engine byte-flipped": lambda d, m: _flip(d / m.engine_file),
    "engine truncated": lambda d, m: _truncate(d / m.engine_file),
    "engine deleted": lambda d, m: (d / m.engine_file).unlink(),
    "canary byte-flipped": lambda d, m: _flip(d / m.canary.file),
    "junk manifest": lambda d, m: (d / layout.MANIFEST).write_text('{"not": "a manifest"'),
    "manifest of another key": lambda d, m: (d / layout.MANIFEST).write_text(
        m.model_copy(update={"key": "0" * 64}).to_json()
    ),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """One clean build, copied for each test: (model, store, key)."""
    root = tmp_path_factory.mktemp("clean")
    model = root / "m.onnx"
    shutil.copy(dynamic_cnn(), model)
    with pytest.MonkeyPatch.context() as env:  # for this build only: never leaked to later tests
        env.setenv("TRTFORGE_ORT_THREADS", "2")
        res = run_build(_request(model, root / "store"))
    return model, root / "store", res.key


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_entry_is_rebuilt_never_a_cache_hit(
    built: tuple[Path, Path, str], tmp_path: Path, corruption: str
) -> None:
    model, clean, key = built
    store = tmp_path / "store"
    shutil.copytree(clean, store)
    d = store / layout.engine_dir(key)
    CORRUPTIONS[corruption](d, Manifest.from_json((clean / layout.manifest_path(key)).read_text()))

    res = run_build(_request(model, store, model_sha256=sha256_of(model)))
    assert res.cache_hit is False and res.key == key
    assert res.replaced_corrupt, "the result says which corruption it replaced"
    m = Manifest.from_json((store / layout.manifest_path(key)).read_text())
    assert sha256_of(d / m.engine_file) == m.sha256 and (d / m.engine_file).stat().st_size == m.size_bytes
    assert sha256_of(d / m.canary.file) == m.canary.sha256
    assert run_build(_request(model, store, model_sha256=sha256_of(model))).cache_hit is True


def test_a_corrupt_entry_that_cannot_be_rebuilt_exits_with_store_integrity(
    built: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """The CLI, as a build Job runs it: the model is gone, so it cannot rebuild; rc and reason say so."""
    model, clean, key = built
    store = tmp_path / "store"
    shutil.copytree(clean, store)
    m = Manifest.from_json((clean / layout.manifest_path(key)).read_text())
    _flip(store / layout.engine_dir(key) / m.engine_file)
    args = [sys.executable, "-m", "trtforge.cli", "build", "--model", str(tmp_path / "gone.onnx")]
    args += ["--sha256", sha256_of(model), "--gpu", "cpu", "--precision", "fp32", "--samples", "2"]
    args += ["--profile", PROFILE[0], "--store", str(store)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == BUILD_EXIT_CODES["StoreIntegrity"], out.stderr[-2000:]
    assert res["reason"] == "StoreIntegrity" and "cacheHit" not in res
    assert "corrupt" in res["error"] and "sha256" in res["error"] and "ModelFetchFailed" in res["error"]


def test_a_junk_manifest_is_an_integrity_failure_not_store_unavailable(
    built: tuple[Path, Path, str], tmp_path: Path
) -> None:
    model, clean, key = built
    store = tmp_path / "store"
    shutil.copytree(clean, store)
    (store / layout.manifest_path(key)).write_text("junk")
    with pytest.raises(BuildError) as e:
        run_build(_request(tmp_path / "gone.onnx", store, model_sha256=sha256_of(model)))
    assert e.value.reason == "StoreIntegrity" and "not a valid manifest" in str(e.value)
