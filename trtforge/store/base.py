"""The engine store interface, one for every backend (`pvc://`, `s3://`, the engine broker).

Paths are relative, `/`-separated, laid out by :mod:`trtforge.contract.layout`. Writes are atomic:
a reader sees a whole object or none. An engine is committed when its manifest exists, and the
manifest is written last with :meth:`EngineStore.commit`, which never replaces an existing one (the
loser of a race sees the winner's manifest).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import BinaryIO, Protocol

from pydantic import BaseModel


class StoreError(RuntimeError):
    """The store could not be reached or refused an operation; the message says which and why."""


class ObjectNotFound(StoreError):
    pass


class IntegrityError(StoreError):
    """What was read does not match its expected sha256."""


class PutResult(BaseModel):
    path: str
    sha256: str
    size_bytes: int


def stream_to(chunks: Iterable[bytes], dst: BinaryIO, path: str) -> PutResult:
    """Copy `chunks` of the object at `path` into `dst`, hashing on the way."""
    h = hashlib.sha256()
    size = 0
    for chunk in chunks:
        h.update(chunk)
        dst.write(chunk)
        size += len(chunk)
    return PutResult(path=path, sha256=h.hexdigest(), size_bytes=size)


def verify(result: PutResult, expected_sha256: str | None, where: str) -> PutResult:
    """`result` unchanged, or IntegrityError naming `where` (a store) if its sha256 is not as expected."""
    if expected_sha256 is not None and result.sha256 != expected_sha256:
        raise IntegrityError(
            f"{where}: {result.path} has sha256 {result.sha256}, expected {expected_sha256} "
            f"({result.size_bytes} bytes read)"
        )
    return result


class EngineStore(Protocol):
    uri: str
    read_only: bool

    def put(self, path: str, src: BinaryIO) -> PutResult:
        """Stream `src` to `path` atomically, computing sha256 on the fly."""
        ...

    def put_bytes(self, path: str, data: bytes) -> PutResult: ...

    def commit(self, path: str, data: bytes) -> bool:
        """Create `path` (a manifest) only if it does not exist. False: another writer won."""
        ...

    def get(self, path: str, dst: BinaryIO, expected_sha256: str | None = None) -> PutResult:
        """Stream `path` into `dst`, verifying sha256 while reading (IntegrityError on mismatch)."""
        ...

    def read_bytes(self, path: str) -> bytes: ...

    def iter_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]: ...

    def exists(self, path: str) -> bool: ...

    def list(self, prefix: str) -> list[str]:
        """Paths under `prefix`, sorted."""
        ...

    def delete(self, path: str) -> None: ...
