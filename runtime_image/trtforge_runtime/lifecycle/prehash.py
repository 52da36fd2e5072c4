"""Pre-hash: begin the sha256 of an engine on a mounted store before the contract is even imported.

For a store on a mounted volume (``pvc://``, ``file://``, a plain path) ``trtforge serve`` calls
:func:`begin` as soon as its arguments are parsed. On a daemon thread it reads the store's
``manifest.json`` with the ``json`` module, opens the files that manifest names (the artifact, then
the canary data) and hashes each through its open descriptor. Hashing releases the GIL, so this runs
while the main thread imports pydantic and the contract models, ONNX Runtime and the server
(docs/design.md, "Runtime cold start").

Nothing here is trusted or decided. :func:`trtforge_runtime.lifecycle.fetch.fetch_engine` reads and validates
the manifest as always, runs the GPU identity check, and only then, for the very path it verifies
in place, takes (:func:`take`) the descriptor and the digest instead of opening and hashing the file
itself; it compares that digest with the validated manifest's sha256 exactly as it compares its
own, and the backend is handed that same descriptor. What the pre-hash could not read, or read
for another path, is simply not used: the usual path does the work and reports what is wrong.

A file whose verified-in-place marker vouches for it as it is (a container restart) is not hashed:
its descriptor is kept with the digest the marker records, marked :attr:`Hashed.vouched`, and the
verification hashes the file itself unless it trusts that marker too. :func:`claim` and :func:`peek`
give :mod:`~trtforge_runtime.lifecycle.preload` what the raw manifest says of its artifact and a duplicate of
the artifact's descriptor with its digest.

What it changes: the artifact is *read* (in place, from the volume; nothing is copied) before the
GPU identity check, instead of after it. A pod on the wrong GPU still never loads the engine onto
a GPU nor serves it; it reads at most what it could hash before the check refused it (and an ONNX
Runtime engine may have been parsed on the CPU by the pre-load), and exits. Stores that download
(``s3://``, the broker) keep the order: nothing large is fetched before the identity check.

Imports: the standard library only (the whole point is to begin before anything heavy).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

PVC_ROOT_ENV = "TRTFORGE_PVC_ROOT"  # as trtforge.store.local (a unit test keeps them equal)
DEFAULT_PVC_ROOT = "/mnt/trtforge/pvc"
HASH_CHUNK = 16 << 20  # what hash_fd reads at once from a file it cannot map
THREAD_NAME = "pre-hash"
# where an open descriptor has a path the backends can open (the verification and the pre-load)
PROC_FD = Path("/proc/self/fd")


@dataclass(frozen=True)
class Hashed:
    """A file opened by the pre-hash: its descriptor (now the taker's) and digest. `vouched`: the
    digest is the one a verified-in-place marker records for this very file as it was when opened
    (a container restart), not a hash made now; the taker checks the marker itself and hashes the
    file if it does not trust it."""

    fd: int
    sha256: str
    vouched: bool = False


@dataclass(frozen=True)
class Claim:
    """What the raw, unvalidated manifest says of its artifact: the file's path, its sha256 and the
    backend that loads it (for :mod:`trtforge_runtime.lifecycle.preload`; nothing here is checked)."""

    path: Path
    sha256: str
    backend: str


_lock = threading.Lock()
_pending: dict[str, Future[Hashed | None]] = {}  # by absolute path; None: left to the usual path
_claim: Claim | None = None  # the last begun pre-hash's raw manifest's artifact


def mounted_root(store_uri: str) -> Path | None:
    """The directory a mounted store's URI names, as ``trtforge.store.local.local_store_for``
    resolves it; None for a store that is not on a mounted volume, or a URI it would refuse."""
    uri = store_uri.strip()
    if uri.startswith("pvc://"):
        claim, _, sub = uri.removeprefix("pvc://").strip("/").partition("/")
        if not claim or (sub and any(p in ("", ".", "..") for p in sub.split("/"))):
            return None
        mount = Path(os.environ.get(PVC_ROOT_ENV) or DEFAULT_PVC_ROOT) / claim
        return mount / sub if sub else mount
    if uri.startswith("file://"):
        path = uri.removeprefix("file://")
        return Path(path) if path.startswith("/") else None
    if not uri or "://" in uri:
        return None
    return Path(uri).expanduser().absolute()


def claim_of(engine_dir: Path, manifest: object) -> Claim | None:
    """The :class:`Claim` a raw manifest makes of its artifact in `engine_dir`; None unless it names
    a plain file name (as :func:`files_to_hash` accepts), a sha256 and a backend, all strings."""
    names = files_to_hash(manifest)
    if not isinstance(manifest, dict) or not names or names[0] != manifest.get("engine_file"):
        return None
    sha256, backend = manifest.get("sha256"), manifest.get("backend")
    if not isinstance(sha256, str) or not isinstance(backend, str):
        return None
    return Claim(engine_dir / names[0], sha256, backend)


def claim() -> Claim | None:
    """What the raw manifest of the last :func:`begin` that read one says of its artifact."""
    return _claim


def files_to_hash(manifest: object) -> list[str]:
    """The plain file names a raw (unvalidated) manifest names, artifact first; [] if it names none
    that could be a file of the engine's directory."""
    if not isinstance(manifest, dict):
        return []
    canary = manifest.get("canary")
    names = [manifest.get("engine_file"), canary.get("file") if isinstance(canary, dict) else None]
    return [
        n
        for n in names
        if isinstance(n, str) and n not in ("", ".", "..", "manifest.json") and "/" not in n and "\0" not in n
    ]


def stat_key(st: os.stat_result) -> dict[str, int]:
    """What a verified-in-place marker records of the file it vouches for (the file as it was)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev}


def marker_vouches(marker: object, st: os.stat_result) -> bool:
    """True when a verified-in-place marker (``trtforge_runtime.lifecycle.fetch``) was written for this very
    file as it is now: then the usual path will not hash it, and neither does the pre-hash."""
    if not isinstance(marker, dict):
        return False
    return all(marker.get(k) == v for k, v in stat_key(st).items())


class NotRegularFile(OSError):
    """A path names something other than a regular file; `kind` says what ("a FIFO", ...)."""

    def __init__(self, path: Path | str, kind: str) -> None:
        super().__init__(f"{path} is {kind}, not a regular file")
        self.kind = kind


def open_regular(path: Path | str) -> int:
    """A read-only descriptor of `path`, which must be a regular file (symlinks followed).

    Opened without blocking and checked with ``fstat`` before anything reads it: a FIFO (or a
    device) planted under a name the manifest gives would otherwise block the reader, or never end.
    Raises :class:`NotRegularFile` naming the path and what it is, or the ``OSError`` of the open."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, _kind(mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return f"of mode {stat.filemode(mode)}"


def hash_file(path: Path | str) -> str:
    """sha256 of the regular file at `path` (:func:`open_regular`, then :func:`hash_fd`)."""
    fd = open_regular(path)
    try:
        return hash_fd(fd)
    finally:
        os.close(fd)


def hash_fd(fd: int) -> str:
    """sha256 of the open file `fd` from its start (the descriptor's offset is left alone).

    A regular file is mapped and hashed in one update, which holds no GIL from its first byte to
    its last: hashed in chunks, the hash needs the GIL back between chunks and waits for it behind
    every import that holds it (a C extension's load does, for tens of ms), which made a 102 MB
    hash take 0.15-0.2 s beside the start's imports instead of 0.07 s (docs/design.md, "Runtime
    cold start"). A file that cannot be mapped (empty, or on a file system without mmap) is read in
    chunks. A mapped file that fails under the hash (truncated in place, which the store's writers
    never do, or a volume whose reads fail) stops the process with SIGBUS instead of raising."""
    try:
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as mapped:
            mapped.madvise(mmap.MADV_SEQUENTIAL)
            return hashlib.sha256(mapped).hexdigest()
    except (ValueError, OSError):
        pass
    h = hashlib.sha256()
    buf = bytearray(HASH_CHUNK)
    view = memoryview(buf)
    offset = 0
    while n := os.preadv(fd, [buf], offset):
        h.update(view[:n])
        offset += n
    return h.hexdigest()


def begin(store_uri: str, key: str, cache_dir: Path) -> threading.Thread | None:
    """Start pre-hashing engine `key`'s files if `store_uri` is a mounted store; the thread, or None.

    `cache_dir` is the runtime's: a file its marker already vouches for is not hashed (its
    descriptor is kept, with the digest the marker records: :attr:`Hashed.vouched`)."""
    global _claim
    _claim = None  # an earlier begin's claim never stands for this engine
    root = mounted_root(store_uri)
    if root is None or len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
        return None
    engine_dir = root / "engines" / key
    try:
        fd = open_regular(engine_dir / "manifest.json")  # this runs on the main thread: never block
        with os.fdopen(fd, "rb") as f:
            raw = json.loads(f.read())
    except (OSError, ValueError):
        return None
    names = files_to_hash(raw)
    _claim = claim_of(engine_dir, raw)
    futures: list[tuple[str, Future[Hashed | None]]] = []
    with _lock:
        for name in names:
            path = str(engine_dir / name)
            if path not in _pending:
                fut: Future[Hashed | None] = Future()
                _pending[path] = fut
                futures.append((name, fut))

    def work() -> None:
        for name, fut in futures:
            fut.set_result(_hash_one(engine_dir / name, cache_dir / key / f".{name}.verified"))

    t = threading.Thread(target=work, name=THREAD_NAME, daemon=True)
    t.start()
    return t


def _hash_one(path: Path, marker: Path) -> Hashed | None:
    try:
        fd = open_regular(path)
    except OSError:
        return None  # the usual path opens it again and says what is wrong
    try:
        try:
            m = json.loads(marker.read_bytes())
            if marker_vouches(m, os.fstat(fd)) and isinstance(m.get("sha256"), str):
                return Hashed(fd, m["sha256"], vouched=True)
        except (OSError, ValueError):
            pass
        return Hashed(fd, hash_fd(fd))
    except BaseException:
        os.close(fd)
        return None


def peek(path: Path) -> Hashed | None:
    """A duplicate of the descriptor the pre-hash made for `path`, with its digest, waiting for it;
    None when it made none, or the taker (:func:`take`) already has it. The caller owns (and must
    close) the duplicate; the original stays the taker's. The duplicate is made under the lock that
    :func:`take` pops under, so it is never made of a descriptor the taker has closed."""
    with _lock:
        fut = _pending.get(str(path))
    if fut is None or (got := fut.result()) is None:
        return None
    with _lock:
        if _pending.get(str(path)) is not fut:
            return None
        return Hashed(os.dup(got.fd), got.sha256, got.vouched)


def take(path: Path) -> Hashed | None:
    """The descriptor and digest the pre-hash made for `path`, waiting for it; once, and None when it
    made none. The caller owns the descriptor from then on."""
    with _lock:
        fut = _pending.pop(str(path), None)
    return None if fut is None else fut.result()
