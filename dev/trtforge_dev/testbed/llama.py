"""llama.cpp for the test bed: built once from the llama-cpp-python sdist and cached.

The test bed's LLM stand-in (docs/llm.md): ``llama-server``, ``llama-quantize``, ``llama-bench``,
``llama-perplexity`` and ``ggml-rpc-server``, built with CMake for the CPU from the ``vendor/llama.cpp``
tree inside the llama-cpp-python sdist (PyPI is reachable where GitHub may not be). Pinned: the sdist
version and its sha256. Cached in ``~/.cache/trtforge/llama.cpp-<version>/bin/``, beside a
``build.json`` recording each binary's sha256, under a file lock (two installs never clobber each
other) and published atomically (built elsewhere, the whole folder renamed into place).
``python -m trtforge_dev.testbed.llama`` builds it (``make llama``); `llama_bin()` is what tests and
the demo call, and it never builds.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from trtforge_dev.testbed.binaries import sha256_file
from trtforge_dev.testbed.paths import cache_dir

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VENDOR_PREFIX = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
# The CMake targets, named as llama.cpp's own CMakeLists.txt names them (tools/rpc: ggml-rpc-server).
TARGETS = ("llama-server", "llama-quantize", "llama-bench", "llama-perplexity", "ggml-rpc-server")
# CPU only, static, portable (no -march=native), and nothing that downloads at configure time.
CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DGGML_RPC=ON",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
)
BIN_DIR_ENV = "TRTFORGE_LLAMA_BIN_DIR"
STAMP = "build.json"


class LlamaCppError(RuntimeError):
    """No usable llama.cpp build; the message says what to run."""


def install_dir() -> Path:
    return cache_dir() / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"


def cached_bin_dir() -> Path:
    """Exactly ``<cache>/llama.cpp-<version>/bin``: what `make llama` fills."""
    return install_dir() / "bin"


def cache_problems(root: Path | None = None) -> list[str]:
    """What is wrong with an installed build (empty: usable): missing stamp, binary or checksum."""
    root = root or install_dir()
    stamp = root / STAMP
    if not stamp.is_file():
        return [f"{stamp} is missing"]
    try:
        recorded = json.loads(stamp.read_text())["binaries"]
    except (ValueError, KeyError, TypeError) as e:
        return [f"{stamp} is unreadable: {e}"]
    problems = []
    for name in TARGETS:
        path = root / "bin" / name
        if not path.is_file() or not os.access(path, os.X_OK):
            problems.append(f"{path} is missing or not executable")
        elif recorded.get(name) != sha256_file(path):
            problems.append(f"{path}: sha256 differs from {stamp}")
    return problems


def bin_dir() -> Path:
    """``$TRTFORGE_LLAMA_BIN_DIR``, else the verified cache; raises LlamaCppError saying how to get it."""
    env = os.environ.get(BIN_DIR_ENV)
    if env:
        return Path(env)
    problems = cache_problems()
    if problems:
        raise LlamaCppError(
            f"no usable llama.cpp {LLAMA_CPP_PYTHON_VERSION} build ({'; '.join(problems)}): run `make llama`"
        )
    return cached_bin_dir()


def llama_bin(name: str) -> Path:
    """The path of one cached llama.cpp tool (``llama-quantize``, ...)."""
    if name not in TARGETS:
        raise ValueError(f"llama.cpp tool {name!r} is not built here; one of {', '.join(TARGETS)}")
    return bin_dir() / name


def _log(msg: str, start: float) -> None:
    print(f">> [llama.cpp {time.monotonic() - start:6.0f}s] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def download_sdist(dest: Path) -> Path:
    """The pinned sdist from PyPI through pip, its sha256 verified."""
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(dest),
        ],
        check=True,
    )  # fmt: skip
    sdist = dest / SDIST_NAME
    got = sha256_file(sdist)
    if got != SDIST_SHA256:
        raise LlamaCppError(f"{sdist}: sha256 {got}, expected {SDIST_SHA256} (a different or tampered sdist)")
    return sdist


def extract_vendor(sdist: Path, dest: Path) -> Path:
    """Only ``vendor/llama.cpp`` from the sdist, into ``dest/llama.cpp``."""
    with tarfile.open(sdist, mode="r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(VENDOR_PREFIX)]
        if not members:
            raise LlamaCppError(f"{sdist}: no {VENDOR_PREFIX} inside")
        tar.extractall(dest, members=members, filter="data")
    src = dest / VENDOR_PREFIX
    shutil.move(src, dest / "llama.cpp")
    return dest / "llama.cpp"


def build(jobs: int | None = None) -> Path:
    """Build and install into `install_dir()` unless a verified build is there; returns the bin folder."""
    start = time.monotonic()
    root = install_dir()
    with _locked(root.with_name(root.name + ".lock")):
        if not cache_problems(root):
            _log(f"already built: {root / 'bin'}", start)
            return root / "bin"
        if root.exists():
            _log(f"rebuilding: {'; '.join(cache_problems(root))}", start)
        jobs = jobs or os.cpu_count() or 1
        with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{root.name}.build.") as tmp:
            work = Path(tmp)
            _log(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist from PyPI", start)
            src = extract_vendor(download_sdist(work), work)
            _log(f"configuring {src} ({' '.join(CMAKE_OPTIONS)})", start)
            subprocess.run(["cmake", "-S", str(src), "-B", str(work / "build"), *CMAKE_OPTIONS], check=True)
            _log(f"building {', '.join(TARGETS)} with {jobs} jobs", start)
            subprocess.run(
                ["cmake", "--build", str(work / "build"), "--target", *TARGETS, "-j", str(jobs)], check=True
            )
            staged = work / "install"
            (staged / "bin").mkdir(parents=True)
            for name in TARGETS:
                shutil.copy2(work / "build" / "bin" / name, staged / "bin" / name)
            seconds = round(time.monotonic() - start, 1)
            stamp = {
                "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
                "sdist_sha256": SDIST_SHA256,
                "cmake_options": list(CMAKE_OPTIONS),
                "jobs": jobs,
                "build_seconds": seconds,
                "binaries": {n: sha256_file(staged / "bin" / n) for n in TARGETS},
            }
            (staged / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
            # Atomic publish: a reader sees the old folder or the whole new one, never half of it.
            old = work / "old"
            if root.exists():
                os.rename(root, old)
            os.rename(staged, root)
        _log(f"built in {seconds}s: {root / 'bin'}", start)
        return root / "bin"


def main() -> int:
    try:
        out = build()
    except (LlamaCppError, subprocess.CalledProcessError, OSError) as e:
        print(f"trtforge llama.cpp: {e}", file=sys.stderr)
        return 1
    for name in TARGETS:
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def rpc_server_pid(host: str, port: int) -> int:
    """The pid of the `ggml-rpc-server` listening on `host`:`port` (a worker rank's process, found by
    its command line: the test bed's pods are processes of this machine)."""
    want = ["-H", host, "-p", str(port)]
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv and argv[0].endswith("ggml-rpc-server") and argv[1:5] == want:
            return int(d.name)
    raise LookupError(f"no ggml-rpc-server on {host}:{port}")
