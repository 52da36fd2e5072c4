"""The build pipeline: fetch → probe → key → cache? → timing cache → build → validate → publish → save cache.

:func:`run_build` returns a :class:`~trtforge.contract.build_result.BuildResult` or raises
:class:`~trtforge_builder.errors.BuildError`. Publishing is atomic: the engine and canary files go
first under content-addressed names (``engine-<sha256[:16]>.plan``), the manifest last through
``store.commit``; a builder that loses a race on the key leaves the winner's files alone, removes its
own and reports the winner's engine. Nothing is published when any step before fails.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, cast

from trtforge.contract import layout
from trtforge.contract.build_result import BuildAccuracy, BuildResult
from trtforge.contract.engine_key import RECIPE_VERSION, EngineKeyRecord, RequestRecord, engine_key
from trtforge.contract.gpu import CPU, FULL_GPU, GPUIdentity
from trtforge.contract.gpu_probe import GPUProbe, GPUProbeError, probe_from_env
from trtforge.contract.manifest import Accuracy, CanaryRef, Manifest, TensorSpec
from trtforge.contract.possession import scoped_key
from trtforge.logs import fields
from trtforge.store import EngineStore, IntegrityError, ObjectNotFound, StoreError, join_uri, open_store
from trtforge.tensorrt.policy import QUANTIZE_HINT, has_qdq, samples_per_profile
from trtforge_builder.backends import BuildBackend, BuildInputs, select_backend
from trtforge_builder.errors import BuildError
from trtforge_builder.fetch import FetchedModel, fetch_model, fetch_staged_model
from trtforge_builder.onnx_model import (
    load_model,
    make_batch_dynamic,
    model_io,
    op_types,
    resolve_profiles,
    save_model,
)
from trtforge_builder.progress import Steps
from trtforge_builder.request import BuildRequest
from trtforge_builder.validate import check_batch_equivalence, make_samples, reference_outputs, validate

log = logging.getLogger("trtforge_builder")


def _store_error(e: StoreError, step: str) -> BuildError:
    return BuildError(str(e), "StoreUnavailable", step=step)


def probe_target(req: BuildRequest, probe: GPUProbe) -> tuple[GPUIdentity, str]:
    """The identity of the device this build runs on, all from the probe; refuses a wrong GPU.

    Every fact recorded (product, compute capability, SM count, memory, MIG profile) is what the
    probe reports (NVML on a real GPU), never a table (docs/design.md §"GPU facts").
    """
    target = req.target
    try:
        arch = probe.arch()
        if target.is_cpu:
            return GPUIdentity(
                product=CPU, compute_capability="none", mig_profile=FULL_GPU, sm_count=0, arch=arch
            ), "cpu"
        devices = probe.devices()
    except GPUProbeError as e:
        raise BuildError(f"GPU probe ({probe.kind}) failed: {e}", "GPUMismatch", step="probe-gpu") from e
    if not devices:
        raise BuildError(
            f"target GPU {target} but no GPU is visible (probe {probe.kind}); the build must run on "
            "a node with the target GPU",
            "GPUMismatch",
            step="probe-gpu",
        )
    dev = devices[0]
    found = dev.identity(arch)
    if not found.matches_target(target):
        raise BuildError(
            f"target GPU {target} but the GPU found is {found.product}"
            f"{'/' + found.mig_profile if found.mig_profile != 'full' else ''} ({dev.uuid}); "
            "refusing to build an engine for another GPU",
            "GPUMismatch",
            step="probe-gpu",
        )
    if not dev.healthy:
        raise BuildError(
            f"GPU {dev.uuid} ({found.product}) is unhealthy; refusing to build on it",
            "GPUMismatch",
            step="probe-gpu",
        )
    return found, f"{dev.name} {dev.uuid}"


def file_request(store: EngineStore, req: BuildRequest, result: BuildResult) -> BuildResult:
    """Record under the operator's request key which engine answered it (docs/design.md §"Engine
    keys"); written after the manifest, so an entry always names a committed engine."""
    if req.request_key is None:
        return result
    m = _cached(store, result.key)
    if m is None:
        raise BuildError(
            f"store {store.uri}: engine {result.key} has no manifest to file request {req.request_key} under",
            "StoreUnavailable",
            step="file-request",
        )
    entry = RequestRecord(
        request_key=req.request_key,
        engine_key=m.key,
        backend=m.backend,
        backend_version=m.backend_version,
        cuda=m.cuda,
        recipe=m.recipe,
    )
    try:
        store.put_bytes(layout.request_path(req.request_key), entry.to_json().encode())
    except StoreError as e:
        raise _store_error(e, "file-request") from e
    log.info("request filed", extra=fields(request_key=req.request_key, key=m.key))
    return result.model_copy(update={"request_key": req.request_key})


def _cached(store: EngineStore, key: str) -> Manifest | None:
    """The committed manifest of `key`, unverified (the winner of a commit race just wrote it)."""
    path = layout.manifest_path(key)
    try:
        if not store.exists(path):
            return None
        text = store.read_bytes(path)
    except ObjectNotFound:
        return None
    except StoreError as e:
        raise _store_error(e, "cache-lookup") from e
    try:
        m = Manifest.from_json(text)
    except ValueError as e:
        why = str(e).splitlines()[0]
        raise BuildError(
            f"store {store.uri}: {path} is not a valid manifest ({why})", "StoreIntegrity", step="publish"
        ) from e
    if m.key != key:
        raise BuildError(
            f"store {store.uri}: {path} names key {m.key}, expected {key}", "StoreIntegrity", step="publish"
        )
    return m


class _Discard:
    """A sink for bytes that are only hashed."""

    def write(self, data: bytes) -> int:
        return len(data)


def _check_file(store: EngineStore, key: str, name: str, sha256: str, size: int | None) -> str | None:
    """Why the stored file is not the one the manifest names (None when it is). StoreError passes."""
    path = layout.engine_path(key, name)
    try:
        got = store.get(path, cast(BinaryIO, _Discard()), expected_sha256=sha256)
    except ObjectNotFound:
        return f"{path} is missing"
    except IntegrityError as e:
        return str(e)
    if size is not None and got.size_bytes != size:
        return f"{path} has {got.size_bytes} bytes, the manifest says {size}"
    return None


def verified_entry(store: EngineStore, key: str) -> tuple[Manifest | None, str | None]:
    """The stored entry of `key` if it is whole: (manifest, None); (None, None) when there is none;
    (None, why) when it is corrupt: a junk manifest, another key, an engine or canary file missing or
    not of the manifest's size and sha256. Every byte is hashed: a cache hit is never taken on the
    manifest alone. StoreError (the store cannot be read) becomes StoreUnavailable."""
    path = layout.manifest_path(key)
    try:
        if not store.exists(path):
            return None, None
        text = store.read_bytes(path)
        try:
            m = Manifest.from_json(text)
        except ValueError as e:
            return None, f"{path} is not a valid manifest ({str(e).splitlines()[0]})"
        if m.key != key:
            return None, f"{path} names key {m.key}, expected {key}"
        why = _check_file(store, key, m.engine_file, m.sha256, m.size_bytes) or _check_file(
            store, key, m.canary.file, m.canary.sha256, None
        )
    except ObjectNotFound:
        return None, None
    except StoreError as e:
        raise _store_error(e, "cache-lookup") from e
    return (None, why) if why else (m, None)


def _result(
    store: EngineStore,
    m: Manifest,
    *,
    cache_hit: bool,
    started: float,
    lost_race: bool = False,
    build_seconds: float | None = None,
) -> BuildResult:
    return BuildResult(
        key=m.key,
        uri=join_uri(store.uri, layout.engine_path(m.key, m.engine_file)),
        manifest_uri=join_uri(store.uri, layout.manifest_path(m.key)),
        sha256=m.sha256,
        size_bytes=m.size_bytes,
        backend=m.backend,
        backend_version=m.backend_version,
        cuda=m.cuda,
        compute_capability=m.gpu.compute_capability,
        gpu=m.gpu.product,
        mig=None if m.gpu.mig_profile == "full" else m.gpu.mig_profile,
        build_seconds=0.0 if cache_hit else (m.build_seconds if build_seconds is None else build_seconds),
        total_seconds=round(time.monotonic() - started, 3),
        cache_hit=cache_hit,
        accuracy=BuildAccuracy.from_manifest(m.accuracy),
        lost_race=lost_race,
    )


def run_build(
    req: BuildRequest,
    *,
    store: EngineStore | None = None,
    probe: GPUProbe | None = None,
    backend: BuildBackend | None = None,
    steps: Steps | None = None,
) -> BuildResult:
    started = time.monotonic()
    steps = steps or Steps()
    try:
        store = store or open_store(req.store_uri)
    except StoreError as e:
        raise BuildError(str(e), "InvalidArgument", step="open-store") from e
    if store.read_only:
        raise BuildError(
            f"store {store.uri} is read-only (the engine broker); build Jobs write the store itself",
            "InvalidArgument",
            step="open-store",
        )
    with tempfile.TemporaryDirectory(prefix="trtforge-build-", dir=req.workdir) as tmp:
        workdir = Path(tmp)
        fetched: FetchedModel | None = None
        if req.staged_model and req.model_sha256 is None:
            raise BuildError(
                "--staged-model needs --sha256 (the staging area is keyed by the model's digest)",
                "InvalidArgument",
                step="parse-arguments",
            )
        if req.model_sha256 is None:  # the key needs the model's sha256
            with steps.step("fetch-model"):
                fetched = fetch_model(req.model_uri, workdir, None)
                log.info("model fetched", extra=fields(sha256=fetched.sha256, bytes=fetched.size_bytes))

        with steps.step("probe-gpu"):
            own_probe = probe is None
            probe = probe or _probe()
            try:
                identity, device = probe_target(req, probe)
            finally:
                if own_probe:
                    probe.close()
            backend = backend or select_backend(
                req.backend, gpu_target=not req.target.is_cpu, probe_kind=probe.kind
            )
            log.info(
                "target GPU found",
                extra=fields(
                    device=device,
                    identity=identity.model_dump(),
                    backend=backend.name,
                    backend_version=backend.version,
                ),
            )

        model_sha = req.model_sha256 or (fetched.sha256 if fetched else "")
        with steps.step("engine-key"):
            record = EngineKeyRecord.for_identity(
                model_sha256=model_sha,
                build=req.build,
                backend=backend.name,
                backend_version=backend.version,
                cuda=backend.cuda,
                identity=identity,
            )
            try:
                key = scoped_key(engine_key(record), req.cache_scope)
            except ValueError as e:
                raise BuildError(f"--cache-scope: {e}", "InvalidArgument", step="engine-key") from e
            log.info(
                "engine key",
                extra=fields(key=key, scope=req.cache_scope, record=record.canonical_json()),
            )

        corrupt: str | None = None
        if not req.rebuild:
            with steps.step("cache-lookup"):
                hit, corrupt = verified_entry(store, key)
            if hit is not None:
                log.info("cache hit: the store has this engine, verified", extra=fields(key=key))
                with steps.step("file-request"):
                    return file_request(store, req, _result(store, hit, cache_hit=True, started=started))
            if corrupt is not None:
                log.warning(
                    "store integrity: the stored entry is corrupt; rebuilding and replacing it",
                    extra=fields(key=key, reason="StoreIntegrity", error=corrupt),
                )

        try:
            if fetched is None:
                with steps.step("fetch-model"):
                    fetched = (
                        fetch_staged_model(store, req, workdir)
                        if req.staged_model
                        else fetch_model(req.model_uri, workdir, req.model_sha256)
                    )
            result = _build_and_publish(
                req, store, backend, identity, key, fetched, workdir, steps, started, replace_corrupt=corrupt
            )
        except BuildError as e:
            if corrupt is None:
                raise
            raise BuildError(
                f"store {store.uri}: the entry of {key} is corrupt ({corrupt}) and rebuilding it failed "
                f"({e.reason}: {e})",
                "StoreIntegrity",
                step=e.step,
            ) from e
        with steps.step("file-request"):
            return file_request(store, req, result)


def check_precision(req: BuildRequest, model: Any) -> None:
    """int8/fp8 need a quantized (Q/DQ) model, on every backend (docs/design.md §"TensorRT")."""
    precision = req.build.precision
    if precision in ("int8", "fp8") and not has_qdq(op_types(model)):
        raise BuildError(
            f"model {req.model_uri}: precision {precision} needs a quantized model, and this one has no "
            "Q/DQ nodes: " + QUANTIZE_HINT.format(mode=precision),
            "InvalidArgument",
            step="check-model",
        )


def _probe() -> GPUProbe:
    try:
        return probe_from_env()
    except GPUProbeError as e:
        raise BuildError(str(e), "GPUMismatch", step="probe-gpu") from e


def _build_and_publish(
    req: BuildRequest,
    store: EngineStore,
    backend: BuildBackend,
    identity: GPUIdentity,
    key: str,
    fetched: FetchedModel,
    workdir: Path,
    steps: Steps,
    started: float,
    *,
    replace_corrupt: str | None = None,
) -> BuildResult:
    with steps.step("check-model"):
        model = load_model(fetched.path, req.model_uri)
        check_precision(req, model)
        io = model_io(model)
        resolved = resolve_profiles(io, req.build.profiles)
        prepared = fetched.path
        if resolved.make_batch_dynamic is not None:
            dyn = make_batch_dynamic(model, resolved.make_batch_dynamic)
            prepared = workdir / "model-dynamic-batch.onnx"
            save_model(dyn, prepared)
            io = model_io(dyn)
            check_batch_equivalence(
                fetched.path,
                prepared,
                io,
                resolved.profiles[0],
                resolved.make_batch_dynamic,
                req.model_uri,
                req.seed,
            )
        del model
        log.info(
            "model checked",
            extra=fields(
                inputs=[(t.name, t.dtype, list(t.dims)) for t in io.inputs],
                outputs=[t.name for t in io.outputs],
                profiles=len(resolved.profiles),
            ),
        )

    cache_path = layout.timing_cache_path(
        backend.version, identity.product, None if identity.mig_profile == "full" else identity.mig_profile
    )
    loaded_cache: bytes | None = None
    if backend.uses_timing_cache and req.timing_cache:
        with steps.step("fetch-timing-cache"):
            try:
                loaded_cache = store.read_bytes(cache_path)
                log.info("timing cache loaded", extra=fields(path=cache_path, bytes=len(loaded_cache)))
            except ObjectNotFound:
                log.info("no timing cache yet", extra=fields(path=cache_path))
            except StoreError as e:
                raise _store_error(e, "fetch-timing-cache") from e

    inp = BuildInputs(
        model_path=prepared,
        source=req.model_uri,
        config=req.build,
        profiles=resolved.profiles,
        io=io,
        workdir=workdir,
        timing_cache=loaded_cache,
    )
    with steps.step("build"):
        t0 = time.monotonic()
        out = backend.build(inp)
        build_seconds = round(time.monotonic() - t0, 3)
        log.info(
            "built", extra=fields(seconds=build_seconds, bytes=out.artifact.stat().st_size, layers=out.layers)
        )

    rtol, atol = req.tolerances
    with steps.step("validate"):
        # Every optimization profile gets samples (and a context) of its own, not only the first.
        counts = samples_per_profile(req.samples, len(resolved.profiles))
        samples = [
            s
            for i, (prof, k) in enumerate(zip(resolved.profiles, counts, strict=True))
            for s in make_samples(io, prof, k, req.seed + i)
        ]
        refs = reference_outputs(prepared, samples, req.model_uri)
        runner = backend.load(out.artifact, inp)
        try:
            accuracy, canary, worst = validate(runner, samples, refs, io, rtol, atol)
        finally:
            runner.close()
        log.info("validated", extra=fields(**accuracy.model_dump()))
        if not accuracy.passed:
            raise BuildError(
                f"validation failed: {worst}; nothing was published", "ValidationFailed", step="validate"
            )

    with steps.step("publish"):
        result = _publish(
            req,
            store,
            backend,
            identity,
            key,
            fetched,
            out.artifact,
            out.inputs,
            out.outputs,
            out.layers,
            accuracy,
            canary.to_bytes(),
            build_seconds,
            started,
            replace_corrupt,
        )

    if backend.uses_timing_cache and req.timing_cache and out.timing_cache:
        with steps.step("save-timing-cache"):
            _save_timing_cache(store, backend, cache_path, loaded_cache, out.timing_cache)
    return result


def _publish(
    req: BuildRequest,
    store: EngineStore,
    backend: BuildBackend,
    identity: GPUIdentity,
    key: str,
    fetched: FetchedModel,
    artifact: Path,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    layers: dict[str, int],
    accuracy: Accuracy,
    canary_bytes: bytes,
    build_seconds: float,
    started: float,
    replace_corrupt: str | None = None,
) -> BuildResult:
    h = hashlib.sha256()
    with open(artifact, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    engine_file = (
        f"{'engine' if backend.name == 'tensorrt' else 'model'}-{h.hexdigest()[:16]}{backend.artifact_suffix}"
    )
    canary_sha = hashlib.sha256(canary_bytes).hexdigest()
    canary_file = f"canary-{canary_sha[:16]}.npz"
    written: list[str] = []
    try:
        with open(artifact, "rb") as f:
            put = store.put(layout.engine_path(key, engine_file), f)
        written.append(put.path)
        if put.sha256 != h.hexdigest():
            raise BuildError(
                f"the engine changed while it was uploaded (sha256 {put.sha256}, expected {h.hexdigest()})",
                "BuildFailed",
                step="publish",
            )
        written.append(store.put_bytes(layout.engine_path(key, canary_file), canary_bytes).path)
        manifest = Manifest(
            key=key,
            engine_file=engine_file,
            sha256=put.sha256,
            size_bytes=put.size_bytes,
            backend=backend.name,
            backend_version=backend.version,
            cuda=backend.cuda,
            gpu=identity,
            build=req.build,
            model_uri=req.model_uri,
            model_sha256=fetched.sha256,
            inputs=inputs,
            outputs=outputs,
            build_seconds=build_seconds,
            accuracy=accuracy,
            canary=CanaryRef(file=canary_file, sha256=canary_sha, atol=accuracy.atol, rtol=accuracy.rtol),
            builder_host=socket.gethostname(),
            layers=layers,
            recipe=RECIPE_VERSION,
        )
        data = manifest.to_json().encode()
        if req.rebuild or replace_corrupt is not None:
            # Replace: after a GPU fault, or over a corrupt entry (a concurrent repair writes the same).
            store.put_bytes(layout.manifest_path(key), data)
            won = True
        else:
            won = store.commit(layout.manifest_path(key), data)
    except StoreError as e:
        _remove(store, written)
        raise _store_error(e, "publish") from e
    except BaseException:
        _remove(store, written)
        raise
    if won:
        log.info("engine published", extra=fields(key=key, engine=engine_file, bytes=put.size_bytes))
        res = _result(store, manifest, cache_hit=False, started=started, build_seconds=build_seconds)
        return res.model_copy(update={"replaced_corrupt": replace_corrupt})
    log.info("another builder committed this key first; using its engine", extra=fields(key=key))
    winner = _cached(store, key)
    if winner is None:
        raise BuildError(
            f"store {store.uri}: commit of {key} lost a race, but no manifest is there",
            "StoreUnavailable",
            step="publish",
        )
    _remove(
        store, [p for p in written if p.rsplit("/", 1)[-1] not in (winner.engine_file, winner.canary.file)]
    )
    return _result(
        store, winner, cache_hit=False, started=started, lost_race=True, build_seconds=build_seconds
    )


def _remove(store: EngineStore, paths: list[str]) -> None:
    for p in paths:
        try:
            store.delete(p)
        except StoreError as e:
            log.warning("could not remove a partial upload", extra=fields(path=p, error=str(e)))


def _save_timing_cache(
    store: EngineStore, backend: BuildBackend, path: str, loaded: bytes | None, ours: bytes
) -> None:
    """Save the cache; merge first with what another builder saved since we loaded it."""
    try:
        try:
            current = store.read_bytes(path)
        except ObjectNotFound:
            current = None
        if current is not None and current != loaded:
            ours = backend.merge_timing_caches(ours, current)
        store.put_bytes(path, ours)
        log.info("timing cache saved", extra=fields(path=path, bytes=len(ours)))
    except StoreError as e:  # the engine is published; a lost cache only slows the next build
        log.warning("could not save the timing cache", extra=fields(path=path, error=str(e)))
