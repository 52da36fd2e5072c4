"""Fetch an engine from the store into the pod's cache volume, verifying sha256 while it streams; or,
from a store on a mounted volume (``pvc://``, ``file://``), verify it where it lies.

Cache layout: ``<cache-dir>/<key>/{<engine file>, canary.npz, manifest.json}`` plus, per verified
file, ``.<file>.verified`` holding ``{"sha256", "size", "mtime_ns", "ino"}``.

Downloaded (any other store): the engine file is verified in memory or on disk
(:mod:`trtforge_runtime.lifecycle.staging` says which and why). In memory, the backend is handed
``/proc/self/fd/<n>`` of a sealed memfd holding the verified bytes, and the cache copy with its
marker is written behind it (:attr:`LocalEngine.cache_written`); on disk, the cache file is written,
verified and renamed into place before the load.

In place (a mounted store): nothing is copied. Each file is opened once, hashed through that open
descriptor (or trusted by a marker from an earlier start, below), and the backend is handed
``/proc/self/fd/<n>``, a path to that same descriptor, which stays open for the life of the process.
So what is loaded is the very file that was hashed, even if the store's name is renamed over in
between. The markers then live in the cache dir as ``.<file>.verified`` and also record the store
file's device and path; a container restart in the same pod trusts a file whose marker still equals
its ``fstat`` without reading it again.

Trust policy for the cache (a container restart must not download again): a file is written to a
temporary name, hashed while it streams, and renamed into place only when its sha256 and size match
the manifest; then its marker is written. On a later start a file whose marker names the manifest's
sha256 *and* whose size, mtime and inode still equal the marker's is trusted without re-hashing (a
``stat``, not a read). Anything that rewrites the file changes its mtime or inode, so it is hashed
again, and fetched again if it no longer matches. The cache volume is the pod's own (an emptyDir);
nothing else writes it. A download stops as soon as it passes the manifest's size, before it can fill
the memory or volume it is written to; partial copies (``.<file>.<pid>.part``) that killed starts
left are removed before the next download of that file.

The manifest itself is always read from the store when the store answers (it is small, at most
``MANIFEST_MAX_BYTES``, and its presence is the engine's commit); when the store cannot be reached,
a cached, verified copy is used and a warning logged.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

from trtforge.contract import layout
from trtforge.contract.manifest import Manifest
from trtforge.logs import fields
from trtforge.store.base import EngineStore, ObjectNotFound, StoreError
from trtforge.store.local import LocalStore
from trtforge_runtime.errors import Refusal
from trtforge_runtime.lifecycle import prehash, staging
from trtforge_runtime.lifecycle.threads import on_thread

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

log = logging.getLogger(__name__)
T = TypeVar("T")
CHUNK = 4 << 20
# The most a downloaded file whose size the manifest does not state (the canary: a few samples) may
# stream; a file whose size it states may stream exactly that.
UNSIZED_MAX_BYTES = 256 << 20
# The most a manifest may have (a few KB in practice; this leaves room for thousands of tensors).
MANIFEST_MAX_BYTES = 4 << 20
_held_open: list[int] = []  # descriptors of files verified in place, open for the process's life


@dataclass
class LocalEngine:
    manifest: Manifest
    artifact: Path
    canary: Path
    downloaded_bytes: int  # 0 when everything came from the cache or was verified in place
    hashed_bytes: int = 0  # read to verify in place (0 when markers vouched for every file)
    # done once the cache copy of an engine file staged in memory is written (None: none was)
    cache_written: Future[Path] | None = None


def _marker(path: Path) -> Path:
    return path.with_name(f".{path.name}.verified")


def _stat_key(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _cached_ok(path: Path, sha256: str, size: int) -> bool:
    """True when `path` carries a marker for this sha256 and has not changed since."""
    try:
        marker = json.loads(_marker(path).read_text())
        return bool(
            marker.get("sha256") == sha256
            and marker.get("size") == size
            and {k: marker.get(k) for k in ("size", "mtime_ns", "ino")} == _stat_key(path)
        )
    except (OSError, ValueError):
        return False


def _write_marker(path: Path, sha256: str) -> None:
    m = _marker(path)
    tmp = m.with_name(m.name + ".tmp")
    tmp.write_text(json.dumps({"sha256": sha256, **_stat_key(path)}))
    os.replace(tmp, m)


class StreamTooLong(Exception):
    """A stream went past the bytes it may have; nothing past them was written."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the stream went past {limit} bytes")
        self.limit = limit


def hash_and_write(
    chunks: Iterable[bytes], out: BinaryIO, depth: int = 4, limit: int | None = None
) -> tuple[str, int]:
    """Write `chunks` to `out` and hash them on a second thread while this one receives the next:
    the receive, the hash and the write all release the GIL, so they overlap instead of taking turns.
    Returns (sha256, bytes). At most `depth` chunks wait between the two; an error on either side
    stops both and is raised here. A stream that would pass `limit` bytes stops at the chunk that
    passes it (not written) with :class:`StreamTooLong`, so a store serving more than it should
    cannot fill the memory or disk it is written to."""
    pending: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
    h = hashlib.sha256()
    failed: list[BaseException] = []

    def consume() -> None:
        while (chunk := pending.get()) is not None:
            if failed:
                continue  # drain, so the receiver never blocks on a full queue
            try:
                h.update(chunk)
                out.write(chunk)
            except BaseException as e:
                failed.append(e)

    worker = threading.Thread(target=consume, name="fetch-hash", daemon=True)
    worker.start()
    n = 0
    too_long = False
    try:
        for chunk in chunks:
            if failed:
                break
            if limit is not None and n + len(chunk) > limit:
                too_long = True
                break
            pending.put(chunk)
            n += len(chunk)
    finally:
        pending.put(None)
        worker.join()
        close = getattr(chunks, "close", None)
        if close is not None:
            close()  # a stream left early (the writer failed) gives its connection back now
    if failed:
        raise failed[0]
    if too_long:
        assert limit is not None
        raise StreamTooLong(limit)
    return h.hexdigest(), n


def stale_parts(names: Iterable[str], file: str, me: int, alive: Callable[[int], bool]) -> list[str]:
    """Of `names` (a cache directory's), the partial copies of `file` that no process is writing:
    left by a start killed mid-download or mid-copy. Never `me`'s own name (the process about to
    write it; after a container restart the same pid may be reused, and then the write truncates
    it) and never a name whose pid is `alive`."""
    stale = []
    for name in names:
        pid = name.removeprefix(f".{file}.").removesuffix(".part")
        if not pid.isdigit() or name != staging.part_name(file, int(pid)):
            continue  # not a partial copy of `file`
        if int(pid) != me and not alive(int(pid)):
            stale.append(name)
    return stale


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (one this process may not signal exists too)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass  # it exists; it is not ours to signal
    return True


def _remove_stale_parts(dst: Path) -> None:
    """Delete the partial copies of `dst` that earlier, killed starts left in the cache volume."""
    try:
        names = os.listdir(dst.parent)
    except OSError:
        return
    for name in stale_parts(names, dst.name, os.getpid(), _pid_alive):
        (dst.parent / name).unlink(missing_ok=True)
        log.info("removed a partial copy an earlier start left", extra=fields(path=str(dst.parent / name)))


def _fetch_file(
    store: EngineStore, src: str, dst: Path, sha256: str, size: int | None, where: staging.Staging
) -> tuple[int, Path, Future[Path] | None]:
    """Stream `src`, hashing as it goes, into `dst` (atomic rename) or, staged in memory, into a
    sealed memfd whose cache copy at `dst` is written behind (the future). The bytes read, the
    path to load, and that future (None on disk). Partial copies of `dst` that killed starts left
    are removed first."""
    t0 = time.monotonic()
    _remove_stale_parts(dst)
    if where is staging.Staging.MEMORY:
        fd = staging.open_memfd(dst.name)
        try:
            with open(fd, "wb", closefd=False) as f:
                n = _stream_verified(store, src, f, sha256, size)
            staging.seal(fd)
        except BaseException:
            os.close(fd)
            raise
        _held_open.append(fd)
        path: Path = prehash.PROC_FD / str(fd)
        cached: Future[Path] | None = staging.copy_to_cache(fd, n, dst, lambda p: _write_marker(p, sha256))
    else:
        tmp = dst.with_name(staging.part_name(dst.name, os.getpid()))
        try:
            with open(tmp, "wb") as f:
                n = _stream_verified(store, src, f, sha256, size)
            os.replace(tmp, dst)
        finally:
            tmp.unlink(missing_ok=True)
        _write_marker(dst, sha256)
        path, cached = dst, None
    secs = time.monotonic() - t0
    log.info(
        "fetched",
        extra=fields(
            path=src,
            bytes=n,
            staged=where.value,
            seconds=round(secs, 3),
            mb_per_s=round(n / 1e6 / max(secs, 1e-6), 1),
        ),
    )
    return n, path, cached


def _stream_verified(store: EngineStore, src: str, out: BinaryIO, sha256: str, size: int | None) -> int:
    """Stream `src` into `out`, hashing it; its bytes, or Refusal(EngineIntegrity) when its sha256 or
    size is not the manifest's. The stream stops as soon as it passes the manifest's size (or
    ``UNSIZED_MAX_BYTES`` where the manifest states none)."""
    limit = UNSIZED_MAX_BYTES if size is None else size
    try:
        got, n = hash_and_write(store.iter_chunks(src, CHUNK), out, limit=limit)
    except StreamTooLong:
        stated = (
            f"the manifest's {size} bytes"
            if size is not None
            else f"{UNSIZED_MAX_BYTES} bytes, the most a file the manifest gives no size for may have"
        )
        raise Refusal(
            "EngineIntegrity",
            f"{src} in store {store.uri} streams more than {stated}; stopped there without keeping "
            "it: the file is corrupt or was tampered with, refusing to load it",
        ) from None
    if got != sha256 or (size is not None and n != size):
        raise Refusal(
            "EngineIntegrity",
            f"{src} in store {store.uri}: sha256 {got} ({n} bytes) does not match the manifest's "
            f"{sha256} ({size if size is not None else '?'} bytes); the file is corrupt or was "
            "tampered with, refusing to load it",
        )
    return n


def _settled(fut: Future[T]) -> None:
    """Wait until `fut` has ended, however it ended."""
    fut.exception()


def _rehashed(path: Path) -> str | None:
    """sha256 of a cached copy; None when it is not a regular file (then it is fetched again)."""
    try:
        return prehash.hash_file(path)
    except prehash.NotRegularFile:
        return None


def _ensure(
    store: EngineStore, src: str, dst: Path, sha256: str, size: int | None, where: staging.Staging | None
) -> tuple[int, Path, Future[Path] | None]:
    """A verified copy of `src`: the cache's (trusted by its marker, or re-hashed), else fetched
    (staged where `where` says; None: :func:`staging.choose` decides). As :func:`_fetch_file`."""
    if dst.exists():
        if _cached_ok(dst, sha256, dst.stat().st_size if size is None else size):
            log.info("using cached copy", extra=fields(path=str(dst)))
            return 0, dst, None
        if (size is None or dst.stat().st_size == size) and _rehashed(dst) == sha256:
            _write_marker(dst, sha256)
            log.info("cached copy re-verified", extra=fields(path=str(dst)))
            return 0, dst, None
        log.warning("cached copy does not match the manifest; fetching again", extra=fields(path=str(dst)))
        dst.unlink()
    return _fetch_file(store, src, dst, sha256, size, where or staging.choose(size))


def _in_place(store: LocalStore, src: str, marker: Path, sha256: str, size: int | None) -> tuple[Path, int]:
    """Verify the store's own file for `src` without copying it: a path to the verified open file,
    and the bytes read to verify it. A :mod:`~trtforge_runtime.lifecycle.prehash` of the same path, if one
    began, gives the open file and its digest; they are checked here as if made here."""
    pre = prehash.take(store.file(src))
    try:
        fd = pre.fd if pre else prehash.open_regular(store.file(src))
    except FileNotFoundError as e:
        raise ObjectNotFound(f"store {store.uri}: {src} does not exist") from e
    except prehash.NotRegularFile as e:
        raise Refusal(
            "EngineIntegrity",
            f"{src} in store {store.uri} is {e.kind}, not a regular file; the store's writers "
            "only ever rename regular files into place, refusing to read it",
        ) from e
    except OSError as e:
        raise StoreError(f"store {store.uri}: cannot read {src}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if size is not None and st.st_size != size:
            raise Refusal(
                "EngineIntegrity",
                f"{src} in store {store.uri} has {st.st_size} bytes, the manifest says {size}; "
                "the file is corrupt or was tampered with, refusing to load it",
            )
        try:
            m = json.loads(marker.read_text())
            trusted = prehash.marker_vouches(m, st) and m.get("sha256") == sha256
        except (OSError, ValueError):
            trusted = False
        hashed = 0
        if trusted:
            log.info("verified in place earlier; unchanged since", extra=fields(path=src))
        else:
            hashed = st.st_size
            t0 = time.monotonic()
            # a digest a marker vouched for is not a hash made now: hash the file if not trusted
            got = pre.sha256 if pre and not pre.vouched else prehash.hash_fd(fd)
            if got != sha256:
                raise Refusal(
                    "EngineIntegrity",
                    f"{src} in store {store.uri}: sha256 {got} does not match the manifest's {sha256}; "
                    "the file is corrupt or was tampered with, refusing to load it",
                )
            tmp = marker.with_name(marker.name + ".tmp")
            tmp.write_text(
                json.dumps({"sha256": sha256, **prehash.stat_key(st), "source": str(store.file(src))})
            )
            os.replace(tmp, marker)
            secs = time.monotonic() - t0
            log.info(
                "verified in place",
                extra=fields(
                    path=src,
                    bytes=st.st_size,
                    seconds=round(secs, 3),
                    pre_hashed=pre is not None and not pre.vouched,
                ),
            )
    except BaseException:
        os.close(fd)
        raise
    if not prehash.PROC_FD.is_dir():  # no /proc: the name itself (the store only ever renames whole files in)
        os.close(fd)
        return store.file(src), hashed
    _held_open.append(fd)
    return prehash.PROC_FD / str(fd), hashed


class _Bounded(io.BytesIO):
    """A write target that refuses to grow past `limit` bytes (:class:`StreamTooLong`)."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, data: ReadableBuffer, /) -> int:
        if self.tell() + memoryview(data).nbytes > self.limit:
            raise StreamTooLong(self.limit)
        return super().write(data)


def _read_manifest(store: EngineStore, key: str, cached: Path) -> Manifest:
    """The engine's manifest from the store (a cached copy when the store cannot be reached), read
    whole only up to ``MANIFEST_MAX_BYTES``, validated; Refusal(EngineIntegrity) when it is missing,
    too large or not a manifest of `key`."""
    mpath = layout.manifest_path(key)
    try:
        bounded = _Bounded(MANIFEST_MAX_BYTES)
        store.get(mpath, bounded)
        raw = bounded.getvalue()
    except StreamTooLong:
        raise Refusal(
            "EngineIntegrity",
            f"{mpath} in store {store.uri} is larger than {MANIFEST_MAX_BYTES} bytes, the most a "
            "manifest may have; stopped there: it is corrupt or was tampered with",
        ) from None
    except ObjectNotFound as e:
        raise Refusal(
            "EngineIntegrity",
            f"engine {key} is not in store {store.uri}: {mpath} does not exist "
            "(not built yet, or its build never committed)",
        ) from e
    except StoreError as e:
        if cached.exists():
            log.warning("store unreachable; using the cached manifest", extra=fields(error=str(e)))
            raw = cached.read_bytes()
        else:
            raise Refusal("StoreUnavailable", f"could not read {mpath} from store {store.uri}: {e}") from e
    try:
        manifest = Manifest.from_json(raw)
    except ValueError as e:
        raise Refusal("EngineIntegrity", f"{mpath} in store {store.uri} is not a valid manifest: {e}") from e
    if manifest.key != key:
        raise Refusal("EngineIntegrity", f"{mpath} names engine key {manifest.key}, expected {key}")
    for f in (manifest.engine_file, manifest.canary.file):
        if "/" in f or f in ("", ".", "..", layout.MANIFEST):
            raise Refusal("EngineIntegrity", f"{mpath}: file name {f!r} must be a plain file name")
    return manifest


def fetch_engine(
    store: EngineStore,
    key: str,
    cache_dir: Path,
    check: Callable[[Manifest], None] | None = None,
    where: staging.Staging | None = None,
) -> LocalEngine:
    """The manifest, and verified local copies of the artifact and the canary data (for a store on a
    mounted volume, the verified store files themselves).

    `check` sees the manifest before anything large is fetched (the GPU identity check). `where`
    forces the staging of a downloaded engine file (None: :func:`staging.choose` decides; the canary
    is always fetched to disk). The runtime asks :func:`trtforge_runtime.lifecycle.warmstart.fetch`, which
    calls this only when the warm start fetched nothing for the same key and cache dir.
    """
    layout.engine_dir(key)  # validates the key
    local = cache_dir / key
    local.mkdir(parents=True, exist_ok=True)
    cached_manifest = local / layout.MANIFEST
    manifest = _read_manifest(store, key, cached_manifest)
    if check is not None:
        check(manifest)
    artifact = local / manifest.engine_file
    canary = local / manifest.canary.file
    files = (
        (manifest.engine_file, manifest.sha256, manifest.size_bytes),
        (manifest.canary.file, manifest.canary.sha256, None),
    )
    n = hashed = 0
    written: list[Future[Path]] = []
    try:
        if isinstance(store, LocalStore):
            (artifact, h1), (canary, h2) = (
                _in_place(store, layout.engine_path(key, f), _marker(local / f), sha, size)
                for f, sha, size in files
            )
            hashed = h1 + h2
        else:
            # Only the engine file may be staged in memory; the canary is small and its size
            # unknown, so it goes to disk, on a thread beside the engine file rather than after
            # it: the session build waits for this whole fetch (docs/design.md, "Runtime cold start").
            (f, sha, size), (cf, csha, _) = files
            disk = staging.Staging.DISK
            beside, _ = on_thread(
                lambda: _ensure(store, layout.engine_path(key, cf), local / cf, csha, None, disk),
                "fetch-beside",
            )
            try:
                got, artifact, cached = _ensure(
                    store, layout.engine_path(key, f), local / f, sha, size, where
                )
            finally:
                _settled(beside)  # the engine file's error, if any, is the one reported
            cgot, canary, ccached = beside.result()
            n = got + cgot
            written.extend(w for w in (cached, ccached) if w is not None)
    except ObjectNotFound as e:
        raise Refusal("EngineIntegrity", f"engine {key} in store {store.uri} is incomplete: {e}") from e
    except StoreError as e:
        raise Refusal("StoreUnavailable", f"could not fetch engine {key} from store {store.uri}: {e}") from e
    tmp = cached_manifest.with_name(cached_manifest.name + ".tmp")
    tmp.write_text(manifest.to_json())
    os.replace(tmp, cached_manifest)
    return LocalEngine(
        manifest=manifest,
        artifact=artifact,
        canary=canary,
        downloaded_bytes=n,
        hashed_bytes=hashed,
        cache_written=written[0] if written else None,
    )
