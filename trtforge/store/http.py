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
GET      ``<base>/checkpoints/<key>/...`` an LLM artefact's ``manifest.json`` and the files it lists
         ``<base>/tuning/<key>/...``      (``<upload>/<path>``), as for engine files; read by
                                         :mod:`trtforge.store.artefacts` (``read_manifest``, ``fetch``)
=======  ==============================  =======================================================

Status codes: 404 — no such engine or file (:class:`ObjectNotFound`); 401 — no or bad token;
403 — the token's namespace has no InferenceDeployment that references this engine, or has not
proven it holds the engine's model; 5xx — the broker or its store failed.

Several brokers: the URI may list endpoints separated by commas (``http://10.0.0.5:8081,
http://10.0.0.6:8081``) where there are no Service IPs; one URL (the broker Service) where there are.
Every request tries the endpoints in turn, starting with the last one that answered, and after a
round where none answered (connection refused or reset, timeout, 5xx) waits with exponential backoff
(``retry_rounds`` rounds). 4xx answers are final. A download that breaks midway (a replica killed)
goes on from the next endpoint: the bytes already passed on are skipped in the new response, and the
caller's sha256 check of the whole file still decides; a file that changed size in between is an
error, never a spliced file. Every request carries ``Authorization: Bearer <token>``, the token
re-read on each request from the file named by ``$TRTFORGE_BROKER_TOKEN_FILE`` (kubelet rotates
projected tokens); no header when the variable is unset. For https, ``$TRTFORGE_BROKER_CA_FILE``
names the CA bundle to trust (else the system's). Only paths under ``engines/``, ``checkpoints/`` and
``tuning/`` are served; timing caches and writes are for build Jobs, which use the store itself.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

from trtforge.logs import fields
from trtforge.store.base import ObjectNotFound, PutResult, StoreError, stream_to, verify
from trtforge.store.local import check_relpath

log = logging.getLogger(__name__)

TOKEN_FILE_ENV = "TRTFORGE_BROKER_TOKEN_FILE"
CA_FILE_ENV = "TRTFORGE_BROKER_CA_FILE"
SHA256_HEADER = "X-Trtforge-Sha256"
TIMEOUT_S = 30.0
RETRY_ROUNDS = 5  # rounds over every endpoint before a request fails
BACKOFF_S = 0.5  # wait after the first round where no endpoint answered; doubles each round
MAX_BACKOFF_S = 8.0
# What the broker serves: engines, and the LLM artefacts runtime pods read (checkpoints, tuning caches).
SERVED_PREFIXES = ("engines/", "checkpoints/", "tuning/")


class _Retry(Exception):
    """This endpoint did not answer (connection, timeout, 5xx): another may."""


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
        retry_rounds: int = RETRY_ROUNDS,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        endpoints = [u.strip().rstrip("/") for u in uri.split(",") if u.strip()]
        if not endpoints or not all(u.startswith(("http://", "https://")) for u in endpoints):
            raise StoreError(f"{uri!r} is not an http(s):// engine broker URI (or a comma-separated list)")
        self.endpoints = endpoints
        self._current = 0  # the endpoint that answered last
        self.retry_rounds = max(1, retry_rounds)
        self.backoff_s = backoff_s
        self.uri = ",".join(endpoints)
        self.token_file = token_file if token_file is not None else os.environ.get(TOKEN_FILE_ENV)
        ca = ca_file if ca_file is not None else os.environ.get(CA_FILE_ENV)
        self.timeout_s = timeout_s
        self._ssl = ssl.create_default_context(cafile=ca) if ca else None

    def __repr__(self) -> str:
        return f"BrokerStore({self.uri!r})"

    def _url(self, path: str, *, directory: bool = False) -> str:
        """The URL of `path` relative to an endpoint (checked; the endpoint is prefixed per attempt)."""
        check_relpath(path)
        if not path.startswith(SERVED_PREFIXES):
            served = ", ".join(f"{p}<key>/..." for p in SERVED_PREFIXES)
            raise StoreError(f"engine broker {self.uri} serves only {served}; not {path}")
        return f"/{quote(path)}" + ("/" if directory else "")

    def _request(self, url: str, method: str = "GET", data: bytes | None = None) -> urllib.request.Request:
        req = urllib.request.Request(url, data=data, method=method)
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

    def _open_one(self, base: str, path: str, url: str, method: str, data: bytes | None = None) -> Any:
        """One attempt at one endpoint. _Retry: try another endpoint; StoreError: final."""
        try:
            return urllib.request.urlopen(
                self._request(base + url, method, data), timeout=self.timeout_s, context=self._ssl
            )
        except urllib.error.HTTPError as e:
            detail = ""
            try:
                detail = e.read(300).decode(errors="replace").strip()
            except Exception:
                pass
            if e.code == 404:
                raise ObjectNotFound(f"engine broker {base}: {path} does not exist") from e
            if e.code in (401, 403):
                why = "no valid token" if e.code == 401 else "this namespace may not read this artefact"
                raise BrokerDenied(
                    f"engine broker {base}: {method} {path} refused ({e.code}, {why})"
                    + (f": {detail}" if detail else "")
                ) from e
            msg = f"engine broker {base}: {method} {path} failed: HTTP {e.code}" + (
                f": {detail}" if detail else ""
            )
            if e.code >= 500:
                raise _Retry(msg) from e
            raise StoreError(msg) from e
        except urllib.error.URLError as e:
            raise _Retry(f"engine broker {base}: cannot reach it to {method} {path}: {e.reason}") from e
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise _Retry(f"engine broker {base}: {method} {path} failed: {e}") from e

    def _open(
        self,
        path: str,
        url: str,
        method: str = "GET",
        *,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> Any:
        """The first endpoint that answers, tried in turn from the last good one, rounds with backoff."""
        last = ""
        n = len(self.endpoints)
        for round_ in range(self.retry_rounds):
            if round_:
                time.sleep(min(MAX_BACKOFF_S, self.backoff_s * 2 ** (round_ - 1)))
            for i in range(n):
                idx = (self._current + i) % n
                try:
                    resp = self._open_one(self.endpoints[idx], path, url, method, data)
                except _Retry as e:
                    last = str(e)
                    log.warning("engine broker unavailable, trying the next", extra=fields(error=last))
                    continue
                self._current = idx
                return resp
        raise StoreError(f"no engine broker answered ({n} endpoint(s), {self.retry_rounds} rounds): {last}")

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
        """The file's bytes, resumed on another endpoint when a response breaks midway."""
        passed = 0  # bytes already yielded
        breaks = 0
        while True:
            resp = self._open(path, self._url(path))
            skip = passed
            with resp:
                announced = resp.headers.get(SHA256_HEADER)
                try:
                    while chunk := resp.read(chunk_size):
                        if skip:
                            if len(chunk) <= skip:
                                skip -= len(chunk)
                                continue
                            chunk, skip = chunk[skip:], 0
                        passed += len(chunk)
                        yield chunk, announced
                    if getattr(resp, "length", None):  # read(n) ends quietly short of Content-Length
                        raise http.client.IncompleteRead(b"", resp.length)
                except (OSError, http.client.HTTPException) as e:
                    breaks += 1
                    if breaks > self.retry_rounds * len(self.endpoints):
                        raise StoreError(
                            f"engine broker {self.uri}: reading {path} failed midway {breaks} times: {e}"
                        ) from e
                    log.warning(
                        "download broke midway; going on from another broker endpoint",
                        extra=fields(path=path, bytes=passed, error=str(e)),
                    )
                    self._current = (self._current + 1) % len(self.endpoints)
                    continue
            if skip:
                raise StoreError(f"engine broker {self.uri}: {path} got shorter between two attempts")
            return

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
