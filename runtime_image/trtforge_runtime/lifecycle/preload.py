"""Pre-load: open an engine's ONNX Runtime session from its pre-hashed file while the contract imports.

For an engine on a mounted store whose raw manifest (as :mod:`~trtforge_runtime.lifecycle.prehash` read it)
names the ``onnxruntime`` backend, ``trtforge serve`` calls :func:`begin` right after the pre-hash
began. It imports numpy and ONNX Runtime on the calling thread (the session needs them) and starts a
thread that waits for the artifact's pre-hash and, only when that digest equals the sha256 the raw
manifest claims, opens the pool's session (:func:`~trtforge_runtime.backends.ort_session.open_session`)
from a duplicate of the very descriptor that was hashed. ONNX Runtime 1.32 releases the GIL for most
of the build, so the session builds while the main thread imports pydantic, the contract and the
server (docs/design.md, "Runtime cold start").

Nothing here is trusted. The backend takes (:func:`take`) the session only for the sha256 of the
validated manifest, whose artifact :func:`~trtforge_runtime.lifecycle.fetch.fetch_engine` verified against it
after the GPU identity check, and only for the thread count it computes itself; otherwise it opens
its own. So the session still serves nothing before the manifest is validated, the identity checked,
the sha256 verified and the canary passed. What changes is when ONNX Runtime first parses the file:
once its bytes match the raw manifest's sha256, before that manifest's schema and the identity check.
ONNX Runtime runs on the CPU, so nothing touches a GPU before that check; the TensorRT backend, which
deserializes onto the GPU, is never pre-loaded.

Imports: the standard library, the logs' helper and the pre-hash only, until :func:`begin` imports
the backend's library.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from trtforge.logs import fields
from trtforge_runtime.lifecycle import prehash
from trtforge_runtime.lifecycle.threads import on_thread

log = logging.getLogger(__name__)
THREAD_NAME = "pre-load"
BACKEND = "onnxruntime"


@dataclass(frozen=True)
class Preloaded:
    """A session opened from a file whose bytes hashed to `sha256`, with `threads` intra-op threads."""

    sha256: str
    threads: int
    session: Any


_lock = threading.Lock()
_pending: Future[Preloaded | None] | None = None


def begin(instances: int | None) -> threading.Thread | None:
    """Pre-load the pool's session of the last pre-hash's engine, for `instances` instances (None:
    the backend's default); the thread, or None when there is nothing to pre-load (no pre-hash, a
    backend other than ONNX Runtime, no ``/proc``, or ONNX Runtime does not import: the usual path
    then reports that)."""
    global _pending
    claim = prehash.claim()
    if claim is None or claim.backend != BACKEND or not prehash.PROC_FD.is_dir():
        return None
    try:
        import numpy  # noqa: F401 (the session's inputs and outputs)
        import onnxruntime  # noqa: F401

        from trtforge_runtime.backends import ort_session

        threads, _solo = ort_session.pool_threads(instances)
    except Exception:
        return None
    fut, t = on_thread(lambda: _open(claim, threads), THREAD_NAME)
    with _lock:
        _pending = fut
    return t


def _open(claim: prehash.Claim, threads: int) -> Preloaded | None:
    from trtforge_runtime.backends import ort_session

    hashed = prehash.peek(claim.path)
    if hashed is None:
        return None
    try:
        if hashed.sha256 != claim.sha256:
            return None
        t0 = time.monotonic()
        session = ort_session.open_session(prehash.PROC_FD / str(hashed.fd), threads)
    finally:
        os.close(hashed.fd)
    log.info(
        "engine session pre-loaded",
        extra=fields(threads=threads, seconds=round(time.monotonic() - t0, 3)),
    )
    return Preloaded(hashed.sha256, threads, session)


def take(sha256: str, threads: int) -> Any | None:
    """The pre-loaded session, waiting for it, if it was opened from bytes that hash to `sha256`
    with `threads` threads; once, and None otherwise (the caller opens its own)."""
    global _pending
    with _lock:
        fut, _pending = _pending, None
    if fut is None:
        return None
    if fut.exception() is not None:
        return None  # the backend opens its own session and reports what fails
    got = fut.result()
    if got is None or got.sha256 != sha256 or got.threads != threads:
        return None
    return got.session


def discard() -> None:
    """Drop a pre-loaded session nobody took (start-up is over), so it holds no memory."""
    global _pending
    with _lock:
        _pending = None
