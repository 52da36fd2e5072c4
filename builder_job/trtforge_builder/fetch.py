"""Fetch the model: streamed, sha256 computed on the way, checked against the pin.

Model URIs: ``pvc://<claim>/<path>`` and plain or ``file://`` paths are read in place (hashed, not
copied); ``s3://<bucket>/<key>`` (credentials as for the S3 store) and ``https://`` / ``http://``
are streamed into the work directory.

An https model behind authentication: the TRTEngine's ``spec.model.secretRef`` Secret, given to the
build as environment (``envFrom``), holds ``TRTFORGE_MODEL_TOKEN``; it is sent as
``Authorization: Bearer <token>`` to the model's own origin (scheme, host, port) only, never along a
redirect to another one.

Redirects (:func:`redirect_refusal`): at most ``MAX_REDIRECTS`` hops, https to https only, and only to
the model's own host and port or to a host the source allows (``spec.model.allowedRedirectHosts``,
``host`` for port 443 or ``host:port``). A plain-http source follows none. Anything else fails the
fetch with reason ``ModelSourceRefused``, naming the hop.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, cast

from trtforge.store.base import EngineStore, IntegrityError, ObjectNotFound, StoreError
from trtforge_builder.errors import BuildError
from trtforge_builder.progress import Progress

if TYPE_CHECKING:
    from trtforge_builder.request import BuildRequest

CHUNK = 1 << 20
HTTP_TIMEOUT_S = 60.0
TOKEN_ENV = "TRTFORGE_MODEL_TOKEN"
MAX_REDIRECTS = 5
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True)
class FetchedModel:
    path: Path
    sha256: str
    size_bytes: int
    uri: str


def _fail(uri: str, why: str) -> BuildError:
    return BuildError(f"model {uri}: {why}", "ModelFetchFailed", step="fetch-model")


def clean_claim_path(uri: str) -> tuple[str, str]:
    """(claim, path) of a ``pvc://<claim>/<path>`` URI whose path is plain names: no ``..``, ``.``,
    empty parts or leading ``/`` (raises ModelFetchFailed naming what is wrong)."""
    rest = uri.removeprefix("pvc://")
    claim, _, sub = rest.partition("/")
    if not claim or not sub:
        raise _fail(uri, "expected pvc://<claim>/<path to the .onnx file>")
    parts = sub.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise BuildError(
            f"model {uri}: the path inside the claim must be plain names (no '..', '.', empty parts or "
            "leading '/'); a model source stays inside its own claim",
            "InvalidArgument",
            step="fetch-model",
        )
    return claim, sub


def local_model_path(uri: str) -> Path:
    from trtforge.store.local import DEFAULT_PVC_ROOT, PVC_ROOT_ENV

    if uri.startswith("pvc://"):
        claim, sub = clean_claim_path(uri)
        mount = Path(os.environ.get(PVC_ROOT_ENV) or DEFAULT_PVC_ROOT) / claim
        path = mount / sub
        try:
            real, root = path.resolve(), mount.resolve()
        except OSError as e:
            raise _fail(uri, f"cannot resolve {path}: {e.strerror or e}") from e
        if root not in real.parents:
            raise BuildError(
                f"model {uri}: {path} resolves to {real}, outside the claim (a symlink out of it); "
                "a model source stays inside its own claim",
                "InvalidArgument",
                step="fetch-model",
            )
        return real
    if uri.startswith("file://"):
        return Path(uri.removeprefix("file://"))
    return Path(uri).expanduser()


def fetch_model(
    uri: str,
    workdir: Path,
    expected_sha256: str | None = None,
    allowed_hosts: Sequence[str] = (),
) -> FetchedModel:
    if uri.startswith("s3://"):
        fetched = _fetch_s3(uri, workdir)
    elif uri.startswith(("https://", "http://")):
        fetched = _fetch_http(uri, workdir, allowed_hosts)
    elif "://" in uri and not uri.startswith(("pvc://", "file://")):
        raise _fail(uri, "unknown scheme; expected pvc://, s3://, https://, file:// or a path")
    else:
        fetched = _hash_local(uri, local_model_path(uri))
    if expected_sha256 is not None and fetched.sha256 != expected_sha256:
        raise BuildError(
            f"model {uri} has sha256 {fetched.sha256}, but --sha256 pins {expected_sha256}",
            "ModelIntegrity",
            step="fetch-model",
        )
    return fetched


def fetch_staged_model(store: EngineStore, req: BuildRequest, workdir: Path) -> FetchedModel:
    """The broker-verified copy of the model from the store's staging area, hashed again on the way."""
    from trtforge.contract.possession import staged_model_path

    sha = req.model_sha256 or ""
    path = staged_model_path(sha)
    dest = workdir / "model.onnx"
    try:
        with open(dest, "wb") as f:
            got = store.get(
                path, cast(BinaryIO, _ProgressWriter(f, Progress(f"reading staged model {path}"))), sha
            )
    except ObjectNotFound as e:
        raise _fail(
            req.model_uri, f"no verified copy at {path} in the store (the verify step stages it)"
        ) from e
    except IntegrityError as e:
        raise BuildError(str(e), "ModelIntegrity", step="fetch-model") from e
    except StoreError as e:
        raise _fail(req.model_uri, str(e)) from e
    return FetchedModel(path=dest, sha256=got.sha256, size_bytes=got.size_bytes, uri=req.model_uri)


def _hash_local(uri: str, path: Path) -> FetchedModel:
    if not path.is_file():
        raise _fail(
            uri, f"no such file {path}" + (" (is the claim mounted?)" if uri.startswith("pvc://") else "")
        )
    h = hashlib.sha256()
    size = path.stat().st_size
    prog = Progress(f"hashing model {uri}", size)
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
                prog.update(len(chunk))
    except OSError as e:
        raise _fail(uri, f"cannot read {path}: {e.strerror or e}") from e
    prog.finish()
    return FetchedModel(path=path, sha256=h.hexdigest(), size_bytes=prog.done, uri=uri)


def _fetch_s3(uri: str, workdir: Path) -> FetchedModel:
    from trtforge.store.s3 import S3Store, parse_s3_uri

    bucket, key = parse_s3_uri(uri)
    if not key:
        raise _fail(uri, "expected s3://<bucket>/<key of the .onnx file>")
    dest = workdir / "model.onnx"
    try:
        store = S3Store(f"s3://{bucket}")
        with open(dest, "wb") as f:
            res = store.get(key, cast(BinaryIO, _ProgressWriter(f, Progress(f"downloading model {uri}"))))
    except ObjectNotFound as e:
        raise _fail(uri, "no such object") from e
    except IntegrityError as e:
        raise BuildError(str(e), "ModelIntegrity", step="fetch-model") from e
    except StoreError as e:
        raise _fail(uri, str(e)) from e
    return FetchedModel(path=dest, sha256=res.sha256, size_bytes=res.size_bytes, uri=uri)


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL, the port made explicit."""
    u = urllib.parse.urlsplit(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    return u.scheme, (u.hostname or "").lower(), port


def _allowed(host: str, port: int, source: str, allowed_hosts: Sequence[str]) -> bool:
    _, src_host, src_port = origin(source)
    if (host, port) == (src_host, src_port):
        return True
    for entry in allowed_hosts:
        name, _, p = entry.strip().lower().partition(":")
        if name == host and int(p or 443) == port:
            return True
    return False


def redirect_refusal(
    source: str, current: str, location: str, hops: int, allowed_hosts: Sequence[str]
) -> str | None:
    """Why the fetch of `source` must not follow a redirect from `current` to `location` (already
    made absolute), the `hops`-th; None: it may. Pure."""
    to_scheme, to_host, to_port = origin(location)
    if hops > MAX_REDIRECTS:
        return f"more than {MAX_REDIRECTS} redirects (the last one to {location})"
    if origin(current)[0] != "https":
        return f"{current} redirects to {location}: a plain-http source follows no redirects"
    if to_scheme != "https":
        return f"{current} redirects to {location}: only https to https is followed"
    if not _allowed(to_host, to_port, source, allowed_hosts):
        return (
            f"{current} redirects to {location}: host {to_host}:{to_port} is not the model's own host "
            "nor in spec.model.allowedRedirectHosts"
        )
    return None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Hand every redirect back to the caller (as an HTTPError), which decides whether to follow."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects())


def _fetch_http(uri: str, workdir: Path, allowed_hosts: Sequence[str] = ()) -> FetchedModel:
    dest = workdir / "model.onnx"
    h = hashlib.sha256()
    token = os.environ.get(TOKEN_ENV, "").strip()
    url, hops = uri, 0
    while True:
        request = urllib.request.Request(url)
        sent_token = bool(token) and origin(url) == origin(uri)  # the model's own origin only
        if sent_token:
            request.add_unredirected_header("Authorization", f"Bearer {token}")
        where = "" if url == uri else f" (at {url}, after {hops} redirect{'s' if hops != 1 else ''})"
        try:
            with _OPENER.open(request, timeout=HTTP_TIMEOUT_S) as resp, open(dest, "wb") as f:
                total = int(resp.headers.get("Content-Length") or 0) or None
                prog = Progress(f"downloading model {uri}", total)
                while chunk := resp.read(CHUNK):
                    h.update(chunk)
                    f.write(chunk)
                    prog.update(len(chunk))
            break
        except urllib.error.HTTPError as e:
            if e.code in REDIRECT_CODES:
                location = urllib.parse.urljoin(url, e.headers.get("Location") or "")
                e.close()
                hops += 1
                why = redirect_refusal(uri, url, location, hops, allowed_hosts)
                if why is not None:
                    raise BuildError(
                        f"model {uri}: redirect refused: {why}", "ModelSourceRefused", step="fetch-model"
                    ) from e
                url = location
                continue
            if e.code in (401, 403):
                if sent_token:
                    hint = "the token was refused"
                elif token:
                    hint = f"the token is sent to {origin(uri)[1]} only, not along a redirect"
                else:
                    hint = f"no token given (${TOKEN_ENV} from spec.model.secretRef)"
                raise _fail(uri, f"HTTP {e.code} {e.reason}{where}: {hint}") from e
            raise _fail(uri, f"HTTP {e.code} {e.reason}{where}") from e
        except urllib.error.URLError as e:
            raise _fail(uri, f"cannot reach the server{where}: {e.reason}") from e
        except OSError as e:
            raise _fail(uri, f"download failed{where}: {e}") from e
    prog.finish()
    if total is not None and prog.done != total:
        raise _fail(uri, f"download ended after {prog.done} of {total} bytes")
    return FetchedModel(path=dest, sha256=h.hexdigest(), size_bytes=prog.done, uri=uri)


class _ProgressWriter:
    """A file wrapper that reports bytes written."""

    def __init__(self, f: object, prog: Progress) -> None:
        self._f = f
        self._prog = prog

    def write(self, data: bytes) -> int:
        n: int = self._f.write(data)  # type: ignore[attr-defined]
        self._prog.update(len(data))
        return n
