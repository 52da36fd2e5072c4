"""The LLM's artefacts from the store, verified, and the tuning record checked against this pod.

Every file of the checkpoint (and of the tuning cache) is streamed from the store and checked against
its manifest's size and sha256 (:mod:`trtforge.store.artefacts`); a copy kept in ``--cache-dir`` from
an earlier start is checked again in place. A file that differs is refused by name. The tuning
record must name this checkpoint and match the pod's GPU product, MIG profile and server version
(:func:`trtforge.contract.llm.tuning.tuning_mismatch`): upstream applies a cache without checking.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
from pathlib import Path

from trtforge.contract.gpu_probe import GPUProbe, probe_identity
from trtforge.contract.llm.artefact import ArtefactKind, ArtefactManifest
from trtforge.contract.llm.recipe import Backend
from trtforge.contract.llm.result import llama_cpp_version
from trtforge.contract.llm.tuning import MismatchReason, TuningRecord, llama_server_args, tuning_mismatch
from trtforge.contract.termination import Reason
from trtforge.logs import fields
from trtforge.store import open_store
from trtforge.store.artefacts import fetch, in_place, read_manifest, verify_folder
from trtforge.store.base import EngineStore, IntegrityError, ObjectNotFound, StoreError
from trtforge_runtime.errors import Refusal
from trtforge_runtime.llm import plans
from trtforge_runtime.llm.supervisor import ServerPlan

log = logging.getLogger(__name__)

# A tuning record for another GPU is a placement problem; for another server version, backend or
# mapping, the record must be made again (termination.py's reasons).
MISMATCH_REASONS: dict[MismatchReason, Reason] = {
    MismatchReason.GPU_PRODUCT: "GPUMismatch",
    MismatchReason.MIG_PROFILE: "GPUMismatch",
    MismatchReason.VERSION: "EngineLoadFailed",
    MismatchReason.BACKEND: "EngineLoadFailed",
    MismatchReason.MAPPING: "EngineLoadFailed",
}


def server_version(binary: str) -> str:
    """The version of the llama-server this pod runs, from its own ``--version``."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=False)
    try:
        return llama_cpp_version(out.stdout + out.stderr)
    except ValueError as e:
        raise Refusal("EngineLoadFailed", f"--server-binary {binary}: {e}") from e


def tuning_refusal(
    record: TuningRecord, checkpoint_key: str, probe: GPUProbe, version: str, backend: Backend
) -> Refusal | None:
    """Why this pod must not apply `record` (None: it may)."""
    if record.checkpoint_key != checkpoint_key:
        return Refusal(
            "EngineLoadFailed",
            f"tuning record was measured with checkpoint {record.checkpoint_key}; "
            f"this pod serves {checkpoint_key}",
        )
    mismatch = tuning_mismatch(record, probe_identity(probe), version, backend)
    if mismatch is None:
        return None
    return Refusal(
        MISMATCH_REASONS[mismatch.reason], f"{mismatch.reason}: {mismatch.message}; refusing to load it"
    )


def fetch_verified(
    store: EngineStore, kind: ArtefactKind, key: str, cache_dir: Path
) -> tuple[ArtefactManifest, Path]:
    """The artefact's folder, every file verified against the store's manifest: on a mounted store
    (a PVC) the store's own folder, checked where it lies; else a copy under `cache_dir`."""
    dest = cache_dir / str(kind) / key
    try:
        manifest = read_manifest(store, kind, key)
        if manifest is None:
            raise Refusal("EngineIntegrity", f"{kind} {key} is not in store {store.uri} (no manifest)")
        there = in_place(store, manifest)
        if there is not None:
            verify_folder(there, manifest)
            log.info("verified in place", extra=fields(kind=str(kind), key=key, folder=str(there)))
            return manifest, there
        if dest.exists():
            verify_folder(dest, manifest)
            log.info("verified kept copy", extra=fields(kind=str(kind), key=key))
        else:
            fetch(store, kind, key, dest)
            log.info(
                "fetched and verified", extra=fields(kind=str(kind), key=key, bytes=manifest.total_bytes)
            )
    except IntegrityError as e:
        raise Refusal("EngineIntegrity", str(e)) from e
    except ObjectNotFound as e:
        raise Refusal("EngineIntegrity", str(e)) from e
    except StoreError as e:
        raise Refusal("StoreUnavailable", str(e)) from e
    return manifest, dest


def plan_from_store(args: argparse.Namespace, extra: list[str], probe: GPUProbe) -> ServerPlan:
    if args.store is None:
        raise ValueError("--checkpoint needs --store")
    try:
        store = open_store(args.store)
    except (StoreError, ValueError) as e:
        raise Refusal("StoreUnavailable", f"--store {args.store}: {e}") from e
    cache = Path(args.cache_dir)
    manifest, folder = fetch_verified(store, ArtefactKind.CHECKPOINT, args.checkpoint, cache)
    info = manifest.checkpoint
    assert info is not None  # a checkpoint manifest has its record (contract)
    canary = info.golden
    name = args.model_name or manifest.key[:12]
    backend = Backend.LLAMA_CPP if args.server == "llama.cpp" else Backend.TENSORRT_LLM
    if manifest.backend is not backend:
        raise Refusal(
            "EngineLoadFailed",
            f"checkpoint {manifest.key} is a {manifest.backend} artefact; "
            f"--server {args.server} serves {backend}",
        )
    flags: list[str] = []
    tuning_cache: Path | None = None
    if args.tuning:
        tmanifest, tfolder = fetch_verified(store, ArtefactKind.TUNING_CACHE, args.tuning, cache)
        record = tmanifest.tuning
        assert record is not None  # a tuning manifest has its record (contract)
        binary = args.server_binary or "llama-server"
        version = server_version(binary) if backend is Backend.LLAMA_CPP else _trtllm_version()
        refusal = tuning_refusal(record, manifest.key, probe, version, backend)
        if refusal is not None:
            raise refusal
        if backend is Backend.LLAMA_CPP:
            try:
                flags = llama_server_args(record)
            except ValueError as e:
                raise Refusal("EngineLoadFailed", f"tuning record {args.tuning}: {e}") from e
        tuning_cache = tfolder / record.cache_file if record.cache_file else None
        log.info("tuning record applies", extra=fields(key=args.tuning, settings=record.settings))
    if backend is Backend.TENSORRT_LLM:
        if not probe.devices():
            raise Refusal("GPUMismatch", "trtllm-serve needs a GPU and this pod's probe sees none")
        return plans.trtllm_plan(args, folder, name, canary, tuning_cache)
    return plans.llama_plan(args, extra, folder / info.model_file, name, canary, tuple(flags))


def _trtllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tensorrt_llm")
    except PackageNotFoundError as e:
        raise Refusal("EngineLoadFailed", "tensorrt_llm is not installed in this image") from e
