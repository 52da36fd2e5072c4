"""The operator's own view of a ``pvc://`` store, through the broker's operator-only endpoints, so the
operator pod mounts no claim (docs/design.md §"Store claim that cannot bind")::

    GET    /store/<path>           the bytes          HEAD /store/<path>   200 when it exists
    PUT    /store/<path>           write (small records: verify grants)
    DELETE /store/<path>           delete (GC; no error when already gone)
    GET    /store/?prefix=<p>      {"paths": [...]}   every path under <p>

Only the operator's ServiceAccount may call them (broker/server.py, ``operator_denial``). Requests go
to the broker's endpoints in turn with the operator's bound token, as runtime pods' reads do
(:class:`trtforge.store.http.BrokerStore`).
"""

from __future__ import annotations

import json
from typing import BinaryIO
from urllib.parse import quote

from trtforge.store.base import ObjectNotFound, PutResult, StoreError
from trtforge.store.http import BrokerStore
from trtforge.store.local import check_relpath

MAX_RECORD_BYTES = 1 << 20  # the broker takes request bodies up to this size (its client_max_size)


class OperatorBrokerStore(BrokerStore):
    """Every path of the store, read and written through the broker as the operator."""

    read_only = False

    def __repr__(self) -> str:
        return f"OperatorBrokerStore({self.uri!r})"

    def _url(self, path: str, *, directory: bool = False) -> str:
        check_relpath(path)
        return f"/store/{quote(path)}"

    def put_bytes(self, path: str, data: bytes) -> PutResult:
        import hashlib

        if len(data) > MAX_RECORD_BYTES:
            raise StoreError(f"{path}: {len(data)} bytes; the operator writes records of at most 1 MiB")
        with self._open(path, self._url(path), "PUT", data=data):
            pass
        return PutResult(path=path, sha256=hashlib.sha256(data).hexdigest(), size_bytes=len(data))

    def put(self, path: str, src: BinaryIO) -> PutResult:
        return self.put_bytes(path, src.read(MAX_RECORD_BYTES + 1))

    def commit(self, path: str, data: bytes) -> bool:
        raise StoreError(f"{self!r}: the operator publishes no engine; build Jobs commit ({path})")

    def delete(self, path: str) -> None:
        try:
            with self._open(path, self._url(path), "DELETE"):
                pass
        except ObjectNotFound:
            pass

    def list(self, prefix: str) -> list[str]:
        if prefix:
            check_relpath(prefix.rstrip("/"))
        with self._open(prefix, f"/store/?prefix={quote(prefix)}") as resp:
            try:
                paths = json.loads(resp.read())["paths"]
            except (ValueError, KeyError, TypeError) as e:
                raise StoreError(
                    f'engine broker {self.uri}: listing {prefix} did not answer {{"paths": [...]}}'
                ) from e
        return sorted(str(p) for p in paths if isinstance(p, str))
