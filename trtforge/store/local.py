"""A store on a mounted directory: ``pvc://<claim>/<path>``, ``file:///abs/path`` or a plain path.

``pvc://<claim>/<path>`` resolves to ``$TRTFORGE_PVC_ROOT/<claim>/<path>`` (default root
``/mnt/trtforge/pvc``; pods mount the claim at ``/mnt/trtforge/pvc/<claim>``). The claim directory
must exist (it is the mount); the path under it is created on first write.

Atomicity on one POSIX filesystem (a RWX volume such as NFS or CephFS included):

- ``put`` streams into a hidden temp file in the destination directory, fsyncs it, then
  ``os.replace``-s it onto the final name and fsyncs the directory. A reader sees the old object or
  the whole new one; a writer killed mid-put leaves only a hidden ``.*.tmp`` file that ``list``,
  ``exists`` and ``get`` never show.
- ``commit`` writes the manifest to a temp file, then ``os.link``-s it to the final name. ``link``
  fails when the name exists, so exactly one of several racing writers creates it, and the
  file appears whole. Where hard links are not supported, an ``O_EXCL`` claim file decides the race
  and the winner ``os.replace``-s its manifest in.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from trtforge.store.base import ObjectNotFound, PutResult, StoreError, stream_to, verify

PVC_ROOT_ENV = "TRTFORGE_PVC_ROOT"
DEFAULT_PVC_ROOT = "/mnt/trtforge/pvc"
CHUNK = 1 << 20
TMP_SUFFIX = ".tmp"


def _hidden(name: str) -> bool:
    return name.startswith(".")


def check_relpath(path: str) -> str:
    """A store path: relative, `/`-separated, no `.`/`..`/empty parts, no hidden (dot) names."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") or _hidden(p) for p in parts):
        raise StoreError(f"store path {path!r} is not a relative path of plain names (like engines/<key>/x)")
    return path


class LocalStore:
    """An :class:`~trtforge.store.base.EngineStore` on a directory."""

    read_only = False

    def __init__(self, root: Path, uri: str | None = None, *, must_exist: Path | None = None) -> None:
        self.root = root
        self.uri = uri or str(root)
        self._must_exist = must_exist

    def __repr__(self) -> str:
        return f"LocalStore({self.uri!r} at {self.root})"

    # -- helpers -----------------------------------------------------------------------------
    def _check_mount(self) -> None:
        if self._must_exist is not None and not self._must_exist.is_dir():
            raise StoreError(
                f"store {self.uri}: the claim is not mounted at {self._must_exist} "
                f"(pvc:// paths resolve under ${PVC_ROOT_ENV}, now {self._must_exist.parent})"
            )

    def _abs(self, path: str) -> Path:
        return self.root / check_relpath(path)

    def _fail(self, what: str, path: str, e: OSError) -> StoreError:
        return StoreError(f"store {self.uri}: cannot {what} {path}: {e.strerror or e}")

    def _mkdirs(self, path: str) -> Path:
        self._check_mount()
        dest = self._abs(path)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._fail("create the directory for", path, e) from e
        return dest

    @staticmethod
    def _fsync_dir(d: Path) -> None:
        try:
            fd = os.open(d, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def _write_temp(self, dest: Path, src: BinaryIO) -> tuple[Path, str, int]:
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=TMP_SUFFIX)
        tmp = Path(tmp_name)
        h = hashlib.sha256()
        size = 0
        try:
            with os.fdopen(fd, "wb") as f:
                while chunk := src.read(CHUNK):
                    h.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp, h.hexdigest(), size

    # -- EngineStore -------------------------------------------------------------------------
    def put(self, path: str, src: BinaryIO) -> PutResult:
        dest = self._mkdirs(path)
        try:
            tmp, sha, size = self._write_temp(dest, src)
        except OSError as e:
            raise self._fail("write", path, e) from e
        try:
            os.replace(tmp, dest)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise self._fail("move into place", path, e) from e
        self._fsync_dir(dest.parent)
        return PutResult(path=path, sha256=sha, size_bytes=size)

    def put_bytes(self, path: str, data: bytes) -> PutResult:
        import io

        return self.put(path, io.BytesIO(data))

    def commit(self, path: str, data: bytes) -> bool:
        import io

        dest = self._mkdirs(path)
        if dest.exists():
            return False
        try:
            tmp, _sha, _size = self._write_temp(dest, io.BytesIO(data))
        except OSError as e:
            raise self._fail("write", path, e) from e
        try:
            try:
                os.link(tmp, dest)
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise self._fail("commit", path, e) from e
                return self._commit_with_claim(tmp, dest, path)
        finally:
            tmp.unlink(missing_ok=True)
        self._fsync_dir(dest.parent)
        return True

    def _commit_with_claim(self, tmp: Path, dest: Path, path: str) -> bool:
        """No hard links here: the writer that creates the claim file first wins."""
        claim = dest.with_name(f".{dest.name}.claim")
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            # The winner may still be moving its manifest in; wait briefly so the loser can read it.
            deadline = time.monotonic() + 10
            while not dest.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            return False
        except OSError as e:
            raise self._fail("commit", path, e) from e
        os.close(fd)
        if dest.exists():
            return False
        try:
            os.replace(tmp, dest)
        except OSError as e:
            raise self._fail("commit", path, e) from e
        self._fsync_dir(dest.parent)
        return True

    def file(self, path: str) -> Path:
        """The file behind store path `path` on the mounted directory (it may not exist), so a reader on
        the same volume can use it in place instead of copying it."""
        self._check_mount()
        return self._abs(path)

    def _open(self, path: str) -> BinaryIO:
        """`path` opened for reading; it must be a regular file (opened without blocking and checked
        before any read, so a FIFO or a device under a store name never blocks or floods a reader)."""
        self._check_mount()
        p = self._abs(path)
        try:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ObjectNotFound(f"store {self.uri}: {path} does not exist") from e
        except OSError as e:
            raise self._fail("read", path, e) from e
        try:
            if stat.S_ISDIR(mode := os.fstat(fd).st_mode):
                raise ObjectNotFound(f"store {self.uri}: {path} does not exist (it is a directory)")
            if not stat.S_ISREG(mode):
                raise StoreError(
                    f"store {self.uri}: {path} is not a regular file ({stat.filemode(mode)}); "
                    "refusing to read it"
                )
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    def iter_chunks(self, path: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        f = self._open(path)
        with f:
            try:
                while chunk := f.read(chunk_size):
                    yield chunk
            except OSError as e:
                raise self._fail("read", path, e) from e

    def get(self, path: str, dst: BinaryIO, expected_sha256: str | None = None) -> PutResult:
        return verify(stream_to(self.iter_chunks(path), dst, path), expected_sha256, f"store {self.uri}")

    def read_bytes(self, path: str) -> bytes:
        return b"".join(self.iter_chunks(path))

    def exists(self, path: str) -> bool:
        self._check_mount()
        return self._abs(path).is_file()

    def list(self, prefix: str) -> list[str]:
        self._check_mount()
        prefix = prefix.lstrip("/")
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root / base if base else self.root
        out: list[str] = []
        if not start.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not _hidden(d)]
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if _hidden(name):
                    continue
                rel = name if rel_dir == "." else f"{rel_dir}/{name}"
                if rel.startswith(prefix):
                    out.append(rel)
        return sorted(out)

    def delete(self, path: str) -> None:
        """Remove `path` (no error when it is already gone) and the directories it leaves empty."""
        self._check_mount()
        p = self._abs(path)
        try:
            p.unlink(missing_ok=True)
        except OSError as e:
            raise self._fail("delete", path, e) from e
        parent = p.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def clean_temp(self, older_than_s: float = 3600.0) -> int:
        """Remove temp files left by writers that died mid-put; returns how many were removed."""
        n = 0
        cutoff = time.time() - older_than_s
        if not self.root.is_dir():
            return 0
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if _hidden(name) and name.endswith(TMP_SUFFIX):
                    p = Path(dirpath) / name
                    try:
                        if p.stat().st_mtime < cutoff:
                            p.unlink()
                            n += 1
                    except OSError:
                        pass
        return n


def local_store_for(uri: str) -> LocalStore:
    """`pvc://claim/path`, `file:///abs/path` or a plain path."""
    if uri.startswith("pvc://"):
        rest = uri.removeprefix("pvc://").strip("/")
        claim, _, sub = rest.partition("/")
        if not claim:
            raise StoreError(f"store URI {uri!r} names no claim; expected pvc://<claim>/<path>")
        root = Path(os.environ.get(PVC_ROOT_ENV) or DEFAULT_PVC_ROOT)
        mount = root / claim
        if sub:
            for p in sub.split("/"):
                if p in ("", ".", ".."):
                    raise StoreError(f"store URI {uri!r} has an empty, '.' or '..' path part")
        return LocalStore(mount / sub if sub else mount, uri.rstrip("/"), must_exist=mount)
    if uri.startswith("file://"):
        path = uri.removeprefix("file://")
        if not path.startswith("/"):
            raise StoreError(f"store URI {uri!r}: file:// URIs need an absolute path (file:///abs/path)")
        return LocalStore(Path(path), uri.rstrip("/"))
    local = Path(uri).expanduser().absolute()
    return LocalStore(local, str(local))
