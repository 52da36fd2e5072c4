"""Warm start: fetch, verify, load and canary-check the engine on a thread while the server imports.

``trtforge serve`` calls :func:`begin` once it has opened the store and the GPU probe, before it
imports the server (aiohttp, prometheus_client, grpc, the batcher). The runtime's start-up then takes its
steps through this module: :func:`fetch`, :func:`load` and the canary (:func:`collect_canary`) each
first collect what the warm start made for the same arguments, waiting for it if it is still working,
and only otherwise fetch, load or check themselves; the modules that do the work never call back
into the warm start. What the warm start could not do, or did for
other arguments, those calls do again themselves and report as usual, so a warm start changes when
the work happens, never what is checked or in which order: the GPU identity check before anything
touches the GPU (and, from a store that downloads, before anything large is fetched), the sha256
before the backend sees the file, the canary before Ready. (:mod:`~trtforge_runtime.lifecycle.preload` may
have opened the session earlier, from bytes that matched the raw manifest; the backend takes it
only for the verified one.)

Why it pays: hashing releases the GIL, and so do ONNX Runtime's runs and (from 1.32, the version the
image pins; 1.30 holds it) its session build, so on two cores the engine is verified, loaded and
checked while the interpreter imports (docs/design.md, "Runtime cold start"). The caller imports
only what the thread needs before the hash (pydantic's contract models, the store) before
:func:`begin`; then :func:`import_backend_library` imports the backend's library (onnxruntime and
numpy), which the session build waits for, on the caller's thread while the thread hashes (or
downloads); then, once a download has ended (the server's imports would starve it), the caller
imports the server, while the session builds. Imports hold the GIL, so two threads importing
at once only both finish later: the one the engine waits for goes first.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from trtforge.logs import fields
from trtforge_runtime.lifecycle.threads import on_thread

if TYPE_CHECKING:
    from trtforge.contract.canary import Canary
    from trtforge.contract.manifest import Manifest
    from trtforge.store.base import EngineStore
    from trtforge_runtime.backends import Backend, Instance
    from trtforge_runtime.lifecycle.canary import CanaryResult
    from trtforge_runtime.lifecycle.fetch import LocalEngine
    from trtforge_runtime.serving.model import ModelSpec

log = logging.getLogger(__name__)
THREAD_NAME = "warm-start"

T = TypeVar("T")
_lock = threading.Lock()
# keyed by (engine key, other arguments as strings); each future is collected once
_fetches: dict[tuple[str, ...], Future[LocalEngine]] = {}
_backends: dict[tuple[str, ...], Future[Backend]] = {}
# keyed by engine key: the backend it was run on, the canary file, the model spec, and its result
_canaries: dict[str, Future[tuple[Backend, Path, ModelSpec, Instance, CanaryResult]]] = {}
# the backend the last begun warm start's manifest names (None: it failed before it knew)
_backend_named: Future[str | None] = Future()
# done once the last begun warm start's fetch ended (None: its store is mounted, nothing downloads)
_download_done: Future[None] | None = None


def begin(
    store: EngineStore,
    key: str,
    cache_dir: Path,
    instances: int | None,
    check: Callable[[Manifest], None] | None = None,
    canary_for: tuple[str | None, int | None] | None = None,
) -> threading.Thread:
    """Start fetching and loading engine `key` on a daemon thread; returns the thread.

    `instances` None: the backend's default (:func:`~trtforge_runtime.backends.default_instances`),
    as the runtime resolves it. `canary_for` (model name, max batch size, as the runtime is given
    them): also run the canary on a new instance of the loaded backend (:func:`collect_canary`)."""
    global _backend_named, _download_done
    from trtforge.store.local import LocalStore

    fetched: Future[LocalEngine] = Future()
    loaded: Future[Backend] = Future()
    named: Future[str | None] = Future()
    here: Future[None] = Future()  # the fetch ended (the files are here, or it failed)
    with _lock:
        _fetches[(key, str(cache_dir))] = fetched
        _backend_named = named
        # A download's read loop takes the GIL for every socket read; the caller waits for it before
        # the server's imports (import_backend_library). A mounted store's hash releases the GIL.
        _download_done = None if isinstance(store, LocalStore) else here

    def checked(manifest: Manifest) -> None:
        if check is not None:
            check(manifest)
        if not named.done():
            named.set_result(manifest.backend)

    def work() -> None:
        t0 = time.monotonic()
        from trtforge_runtime.lifecycle.fetch import fetch_engine

        try:
            local = fetch_engine(store, key, cache_dir, checked)
        except BaseException as e:
            fetched.set_exception(e)
            return
        finally:
            if not named.done():
                named.set_result(None)
            if not here.done():
                here.set_result(None)
        t1 = time.monotonic()
        # after the fetch: numpy, which this imports, is the caller's to import while the fetch runs
        from trtforge_runtime.backends import default_instances, load_backend

        # the backend's modules first (the caller may be importing them now), then the canary is
        # decoded on another thread while the session builds
        _import_modules(local.manifest.backend)
        decoded = _decode_canary(local.canary) if canary_for is not None else None
        n = instances or default_instances(local.manifest.backend)
        with _lock:
            _backends[(key, str(local.artifact), str(n))] = loaded
        fetched.set_result(local)
        try:
            backend = load_backend(local.manifest, local.artifact, n)
        except BaseException as e:
            loaded.set_exception(e)
            return
        canary: Future[tuple[Backend, Path, ModelSpec, Instance, CanaryResult]] = Future()
        if canary_for is not None:
            with _lock:
                _canaries[key] = canary
        loaded.set_result(backend)
        if canary_for is not None:
            _canary(canary, local, backend, *canary_for, decoded=decoded)
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


# What loading each backend imports (its module, and the library under it), in import order.
BACKEND_MODULES = {
    "onnxruntime": ("numpy", "onnxruntime", "trtforge_runtime.backends.onnxruntime_backend"),
    "tensorrt": ("numpy", "trtforge_runtime.backends.tensorrt_backend"),
}


def import_backend_library(wait_s: float) -> str | None:
    """Import, on the calling thread, what loading the engine of the last :func:`begin` imports;
    returns the backend's name, or None when it was not known within `wait_s` seconds (then the
    thread imports what it needs itself).

    The caller calls this right after :func:`begin` and before importing anything else: the thread
    then hashes the artifact (no GIL) while this imports (GIL), and the session build, which needs
    the library, is not kept waiting by the server's imports. From a store that downloads, this then
    also waits for the download to end before it returns: the download's read loop takes the GIL
    for every socket read, and behind the server's imports the 102 MB ResNet-50 took 0.65-0.9 s
    instead of 0.4 s. `wait_s` bounds the whole wait, so a slow store never holds the caller back
    from importing the server and listening for longer."""
    deadline = time.monotonic() + wait_s
    try:
        backend = _backend_named.result(timeout=wait_s)
    except TimeoutError:
        return None
    _import_modules(backend)
    if _download_done is not None:  # let the download finish before the server's imports
        try:
            _download_done.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            pass
    return backend


def _import_modules(backend: str | None) -> None:
    for module in BACKEND_MODULES.get(backend or "", ()):
        try:
            importlib.import_module(module)
        except Exception:
            break  # load_backend imports it again and reports what fails


def _decode_canary(path: Path) -> Future[Canary]:
    """Read and decode the (verified) canary file on a thread of its own, so that work (which holds
    the GIL) is done while the session builds (which mostly does not), not after it."""

    def work() -> Canary:
        from trtforge_runtime.lifecycle.canary import read_canary

        return read_canary(path)

    return on_thread(work, "canary-read")[0]


def _canary(
    out: Future[tuple[Backend, Path, ModelSpec, Instance, CanaryResult]],
    local: LocalEngine,
    backend: Backend,
    model_name: str | None,
    max_batch_size: int | None,
    decoded: Future[Canary] | None = None,
) -> None:
    from trtforge_runtime.lifecycle.canary import run_canary
    from trtforge_runtime.serving.model import default_model_name, model_spec

    try:
        m = local.manifest
        spec = model_spec(m, model_name or default_model_name(m), max_batch_size)
        instance = backend.new_instance()
        result = run_canary(instance, local.canary, spec, m.canary.atol, m.canary.rtol, decoded)
        out.set_result((backend, local.canary, spec, instance, result))
    except BaseException as e:
        out.set_exception(e)


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


def fetch(
    store: EngineStore, key: str, cache_dir: Path, check: Callable[[Manifest], None] | None = None
) -> LocalEngine:
    """The start-up's fetch step: what the warm start fetched for (`key`, `cache_dir`), after `check`
    sees its manifest again; else :func:`~trtforge_runtime.lifecycle.fetch.fetch_engine` runs here."""
    warm = collect_fetch(key, cache_dir)
    if warm is not None:
        if check is not None:
            check(warm.manifest)
        return warm
    from trtforge_runtime.lifecycle.fetch import fetch_engine

    return fetch_engine(store, key, cache_dir, check)


def load(manifest: Manifest, artifact: Path, instances: int) -> Backend:
    """The start-up's load step: the backend the warm start loaded for these arguments; else
    :func:`~trtforge_runtime.backends.load_backend` runs here."""
    warm = collect_backend(manifest.key, artifact, instances)
    if warm is not None:
        return warm
    from trtforge_runtime.backends import load_backend

    return load_backend(manifest, artifact, instances)


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


def collect_canary(
    key: str, backend: Backend, canary: Path, spec: ModelSpec
) -> tuple[Instance, CanaryResult] | None:
    """The instance the warm start ran engine `key`'s canary on and its result, for this very
    backend, canary file and model spec, once; None otherwise (the caller runs the canary itself)."""
    if threading.current_thread().name == THREAD_NAME:
        return None
    with _lock:
        fut = _canaries.pop(key, None)
    got = _result(fut)
    if got is not None and got[0] is backend and got[1] == canary and got[2] == spec:
        return got[3], got[4]
    return None
