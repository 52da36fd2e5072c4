"""Warm start: fetch, verify and load the engine on a thread while the HTTP server's modules import.

``trtforge serve`` calls :func:`begin` before it imports the server (aiohttp, prometheus_client, the
batcher). The runtime then calls :func:`~trtforge_runtime.fetch.fetch_engine` and
:func:`~trtforge_runtime.backends.load_backend` as always, and each first collects what the warm
start made for the same arguments, waiting for it if it is still working. What the warm start could
not do, or did for other arguments, those calls do again themselves and report as usual, so a warm
start changes when the work happens, never what is checked or in which order: the GPU identity check
before anything large is read, the sha256 before the backend sees the file, the canary before Ready.

Why it pays: hashing releases the GIL, and so does ONNX Runtime while it builds a session, so on two
cores the engine is verified and loaded while the interpreter imports the server (measured in
docs/benchmarks.md, "Cold start").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from trtforge.logs import fields

if TYPE_CHECKING:
    from trtforge.contract.manifest import Manifest
    from trtforge.store.base import EngineStore
    from trtforge_runtime.backends import Backend
    from trtforge_runtime.fetch import LocalEngine

log = logging.getLogger(__name__)
THREAD_NAME = "warm-start"

T = TypeVar("T")
_lock = threading.Lock()
# keyed by (engine key, other arguments as strings); each future is collected once
_fetches: dict[tuple[str, ...], Future[LocalEngine]] = {}
_backends: dict[tuple[str, ...], Future[Backend]] = {}


def begin(
    store: EngineStore,
    key: str,
    cache_dir: Path,
    instances: int | None,
    check: Callable[[Manifest], None] | None = None,
) -> threading.Thread:
    """Start fetching and loading engine `key` on a daemon thread; returns the thread.

    `instances` None: the backend's default (:func:`~trtforge_runtime.backends.default_instances`),
    as the runtime resolves it."""
    fetched: Future[LocalEngine] = Future()
    loaded: Future[Backend] = Future()
    with _lock:
        _fetches[(key, str(cache_dir))] = fetched

    def work() -> None:
        from trtforge_runtime.backends import default_instances, load_backend
        from trtforge_runtime.fetch import fetch_engine

        t0 = time.monotonic()
        try:
            local = fetch_engine(store, key, cache_dir, check)
        except BaseException as e:
            fetched.set_exception(e)
            return
        t1 = time.monotonic()
        n = instances or default_instances(local.manifest.backend)
        with _lock:
            _backends[(key, str(local.artifact), str(n))] = loaded
        fetched.set_result(local)
        try:
            loaded.set_result(load_backend(local.manifest, local.artifact, n))
        except BaseException as e:
            loaded.set_exception(e)
            return
        log.info(
            "warm start: engine fetched and loaded",
            extra=fields(
                key=key, warm_fetch_s=round(t1 - t0, 3), warm_load_s=round(time.monotonic() - t1, 3)
            ),
        )

    t = threading.Thread(target=work, name=THREAD_NAME, daemon=True)
    t.start()
    log.info("warm start began", extra=fields(key=key))
    return t


def _take(
    registry: dict[tuple[str, ...], Future[T]], key: tuple[str, ...]
) -> tuple[Future[T] | None, list[Future[T]]]:
    """Pop the future for `key` and every other future for the same engine (made for other arguments)."""
    with _lock:
        same = registry.pop(key, None)
        others = [registry.pop(k) for k in [k for k in registry if k[0] == key[0]]]
    return same, others


def _result(fut: Future[T] | None) -> T | None:
    if fut is None:
        return None
    try:
        return fut.result()
    except BaseException:
        return None  # the caller does the work again and reports what fails


def collect_fetch(key: str, cache_dir: Path) -> LocalEngine | None:
    """What the warm start fetched for (`key`, `cache_dir`), once; None if it fetched nothing for them."""
    if threading.current_thread().name == THREAD_NAME:
        return None  # the warm start's own call does the work
    same, _ = _take(_fetches, (key, str(cache_dir)))
    return _result(same)


def collect_backend(key: str, artifact: Path, instances: int) -> Backend | None:
    """The backend the warm start loaded for these arguments, once; None if it loaded none for them.

    A backend it loaded for the same engine with other arguments is closed, so it holds no memory."""
    if threading.current_thread().name == THREAD_NAME:
        return None
    same, others = _take(_backends, (key, str(artifact), str(instances)))
    for fut in others:
        if (b := _result(fut)) is not None:
            b.close()
    return _result(same)
