"""A READ-ONLY client for the operator's engine broker: ``http(s)://host:port[/base]``.

Runtime pods in tenant namespaces hold no store credentials; they fetch engines from the broker
(docs/design.md §"Store and engine broker"), presenting their projected service-account token. The
URL scheme, relative to the store URI (``<base>``):

=======  ==============================  =======================================================
method   path                            answer
=======  ==============================  =======================================================
GET      ``<base>/engines/<key>/<file>``  200 with the bytes; or 302/307 to a short-lived URL
                                         (e.g. S3 presigned), which the client follows *without*
                                         its Authorization header. An optional response header
                                         ``X-Trtforge-Sha256`` is checked against the body.
HEAD     ``<base>/engines/<key>/<file>``  200 when it exists (``exists``)
GET      ``<base>/engines/<key>/``        200 ``{"files": ["manifest.json", ...]}`` (``list``)
=======  ==============================  =======================================================

Status codes: 404 — no such engine or file (:class:`ObjectNotFound`); 401 — no or bad token;
403 — the token's namespace has no InferenceDeployment that references this engine; 5xx — the
broker or its store failed. Every request carries ``Authorization: Bearer <token>``, the token
re-read on each request from the file named by ``$TRTFORGE_BROKER_TOKEN_FILE`` (kubelet rotates
projected tokens); no header when the variable is unset. For https, ``$TRTFORGE_BROKER_CA_FILE``
names the CA bundle to trust (else the system's). Only paths under ``engines/`` are served; timing
caches and writes are for build Jobs, which use the store itself.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

from trtforge.store.base import ObjectNotFound, PutResult, StoreError, stream_to, verify
from trtforge.store.local import check_relpath

TOKEN_FILE_ENV = "TRTFORGE_BROKER_TOKEN_FILE"
CA_FILE_ENV = "TRTFORGE_BROKER_CA_FILE"
SHA256_HEADER = "X-Trtforge-Sha256"
TIMEOUT_S = 30.0


class BrokerDenied(StoreError):
    """The broker refused (401: no valid token, 403: this namespace may not read the engine): retrying
    the same request cannot help."""


class BrokerStore:
    """An :class:`~trtforge.store.base.EngineStore` that can only read, through the engine broker."""

    read_only = True

    def __init__(
        self,
        uri: str,
        token_file: str | None = None,
        ca_file: str | None = None,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        if not uri.startswith(("http://", "https://")):
            raise StoreError(f"{uri!r} is not an http(s):// engine broker URI")
        self.uri = uri.rstrip("/")
        self.token_file = token_file if token_file is not None else os.environ.get(TOKEN_FILE_ENV)
        ca = ca_file if ca_file is not None else os.environ.get(CA_FILE_ENV)
        self.timeout_s = timeout_s
        self._ssl = ssl.create_default_context(cafile=ca) if ca else None

    def __repr__(self) -> str:
        return f"BrokerStore({self.uri!r})"

    def _url(self, path: str, *, directory: bool = False) -> str:
        check_relpath(path)
        if not path.startswith("engines/"):
            raise StoreError(f"engine broker {self.uri} serves only engines/<key>/...; not {path}")
        return f"{self.uri}/{quote(path)}" + ("/" if directory else "")

    def _request(self, url: str, method: str = "GET") -> urllib.request.Request:
        req = urllib.request.Request(url, method=method)
        if self.token_file:
            try:
                with open(self.token_file) as f:
                    token = f.read().strip()
            except OSError as e:
                raise StoreError(
                    f"engine broker {self.uri}: cannot read the token file {self.token_file} "
                    f"(${TOKEN_FILE_ENV}): {e.strerror or e}"
                ) from e
            # Unredirected: never sent on to a presigned URL the broker redirects to.
            req.add_unredirected_header("Authorization", f"Bearer {token}")
        return req

    def _open(self, path: str, url: str, method: str = "GET") -> Any:
        try:
            return urllib.request.urlopen(
                self._request(url, method), timeout=self.timeout_s, context=self._ssl
            )
        except urllib.error.HTTPError as e:
            detail = ""
            try:
                detail = e.read(300).decode(errors="replace").strip()
            except Exception:
                pass
            if e.code == 404:
                raise ObjectNotFound(f"engine broker {self.uri}: {path} does not exist") from e
            if e.code in (401, 403):
                why = "no valid token" if e.code == 401 else "this namespace may not read this engine"
                raise BrokerDenied(
                    f"engine broker {self.uri}: {method} {path} refused ({e.code}, {why})"
                    + (f": {detail}" if detail else "")
                ) from e
            raise StoreError(
                f"engine broker {self.uri}: {method} {path} failed: HTTP {e.code}"
                + (f": {detail}" if detail else "")
            ) from e
        except urllib.error.URLError as e:
            raise StoreError(
                f"engine broker {self.uri}: cannot reach it to {method} {path}: {e.reason}"
            ) from e
        except (OSError, ValueError) as e:
            raise StoreError(f"engine broker {self.uri}: {method} {path} failed: {e}") from e

    def _read_only(self, what: str) -> StoreError:
        return StoreError(f"engine broker {self.uri} is read-only: cannot {what}")

    # -- writes are refused -----------------------------------------------------------------
    def put(self, path: str, src: BinaryIO) -> PutResult:
        raise self._read_only(f"write {path}")

    def put_bytes(self, path: str, data: bytes) -> PutResult:
        raise self._read_only(f"write {path}")

    def commit(self, path: str, data: bytes) -> bool:
        raise self._read_only(f"commit {path}")

    def delete(self, path: str) -> None:
        raise self._read_only(f"delete {path}")

    # -- reads -------------------------------------------------------------------------------
    def _stream(self, path: str, chunk_size: int) -> Iterator[tuple[bytes, str | None]]:
        resp = self._open(path, self._url(path))
        with resp:
            announced = resp.headers.get(SHA256_HEADER)
            try:
                while chunk := resp.read(chunk_size):
                    yield chunk, announced
            except OSError as e:
                raise StoreError(f"engine broker {self.uri}: reading {path} failed midway: {e}") from e

    def iter_chunks(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        for chunk, _ in self._stream(path, chunk_size):
            yield chunk

    def get(self, path: str, dst: BinaryIO, expected_sha256: str | None = None) -> PutResult:
        announced: list[str | None] = [None]  # the broker's X-Trtforge-Sha256, known once streaming starts

        def chunks() -> Iterator[bytes]:
            for chunk, header in self._stream(path, 1 << 20):
                announced[0] = header
                yield chunk

        result = stream_to(chunks(), dst, path)
        for want in (expected_sha256, announced[0]):
            verify(result, want, f"engine broker {self.uri}")
        return result

    def read_bytes(self, path: str) -> bytes:
        import io

        buf = io.BytesIO()
        self.get(path, buf)
        return buf.getvalue()

    def exists(self, path: str) -> bool:
        try:
            with self._open(path, self._url(path), "HEAD"):
                return True
        except ObjectNotFound:
            return False

    def list(self, prefix: str) -> list[str]:
        """Only ``engines/<key>/`` (the files of one engine) can be listed through the broker."""
        parts = prefix.strip("/").split("/")
        if len(parts) != 2 or parts[0] != "engines":
            raise StoreError(f"engine broker {self.uri} lists only engines/<key>/, not {prefix!r}")
        d = f"engines/{parts[1]}"
        with self._open(d, self._url(d, directory=True)) as resp:
            try:
                files = json.loads(resp.read())["files"]
            except (ValueError, KeyError, TypeError) as e:
                raise StoreError(
                    f'engine broker {self.uri}: listing {d}/ did not answer {{"files": [...]}}'
                ) from e
        return sorted(f"{d}/{name}" for name in files if isinstance(name, str) and "/" not in name)
