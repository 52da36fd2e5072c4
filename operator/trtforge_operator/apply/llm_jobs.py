"""Pure builders of an LLM engine's Jobs: one quantize Job per checkpoint key, one tune Job per
target (docs/llm.md §"The forge steps"). They run the builder image's ``trtforge quantize`` and
``trtforge tune`` with the store mounts builds use, the same labels, requester annotations, slots and
termination message as build Jobs, so the rest of the operator treats them as builds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from trtforge.contract.gpu import GPUTarget, MigStrategy
from trtforge.contract.llm import Backend, Parallelism, QuantizationSpec
from trtforge.contract.llm.artefact import KIND_DIRS
from trtforge.contract.possession import staged_model_path
from trtforge.contract.quantity import parse_quantity
from trtforge_operator.apply.children import (
    PVC_ROOT,
    _avoid_affinity,
    _gpu_limits,
    _pvc_claim,
    container,
    job_name,
    job_scratch_and_env,
    pod_security_context,
    store_mounts,
)
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import (
    ANNOTATION_ATTEMPT,
    ANNOTATION_CREATED_FOR,
    ANNOTATION_FAULT,
    ANNOTATION_REBUILD_CAUSE,
    ANNOTATION_REQUEST_DIGEST,
    ANNOTATION_TARGET,
    APP_COMPONENT,
    BASE_LABELS,
    COMPONENT_BUILDER,
    LABEL_BUILD_ID,
    LABEL_BUILD_KIND,
    LABEL_REQUESTER_NAMESPACE,
    LABEL_TARGET,
    requester_annotation,
)

QUANTIZE = "quantize"
TUNE = "tune"
REBUILD = "rebuild"  # a re-tune after a GPU fault (or the TRTEngine's ask): the kind ONNX rebuilds carry
TERMINATION_PATH = "/dev/termination-log"


def llm_job_name(kind: str, job_id: str, attempt: int = 1) -> str:
    """`trtforge-build-<id>` (`-a<n>` for attempt n > 1), as build Jobs (slots, wake-ups and clean-up
    find them by the prefix)."""
    return job_name(job_id, attempt)


@dataclass(frozen=True)
class QuantizeRequest:
    """Quantize one source digest to one recipe (whatever the targets and namespaces asking)."""

    job_id: str  # the scoped checkpoint key's first 20 characters
    checkpoint_key: str
    source_sha256: str  # the digest the namespace proved it holds: the source is staged in the store
    quantization: QuantizationSpec
    backend: Backend
    canary_prompt: str
    canary_tokens: int
    requester: str
    timeout_seconds: int = 3600
    attempt: int = 1

    @property
    def job_name(self) -> str:
        return llm_job_name(QUANTIZE, self.job_id, self.attempt)


@dataclass(frozen=True)
class TuneRequest:
    """Measure one checkpoint's serving settings on one target and mapping."""

    job_id: str
    checkpoint_key: str
    target: GPUTarget
    parallelism: Parallelism
    backend: Backend
    node_selector: dict[str, str]
    requester: str
    mig_strategy: MigStrategy = MigStrategy.MIXED
    timeout_seconds: int = 3600
    attempt: int = 1
    # A re-tune (docs/llm.md §"GPU faults"): the fault id (or the ask's id), measured again off the
    # faulty nodes and replacing the stored record. Named as an ONNX rebuild of the checkpoint key.
    rebuild_of: str | None = None
    rebuild_asked: bool = False
    avoid_nodes: tuple[str, ...] = ()
    # GPUs the Job takes: the mapping's, or one node's where the mapping spans nodes (a rank group's
    # tune measures one rank's node; docs/llm.md §"Groups"). 0: the mapping's.
    gpus: int = 0

    @property
    def job_name(self) -> str:
        if self.rebuild_of:
            return job_name(self.checkpoint_key[:20], rebuild_of=self.rebuild_of, asked=self.rebuild_asked)
        return llm_job_name(TUNE, self.job_id, self.attempt)


def _staged_source(store_uri: str, sha256: str) -> str:
    return f"{store_uri.rstrip('/')}/{staged_model_path(sha256)}"


def quantize_args(req: QuantizeRequest, cfg: OperatorConfig) -> list[str]:
    q = req.quantization
    c = q.calibration
    args = [
        "trtforge", "quantize",
        "--source", _staged_source(cfg.store_uri, req.source_sha256),
        "--sha256", req.source_sha256,
        "--recipe", q.recipe.value,
        "--calibration-dataset", c.dataset,
        "--calibration-samples", str(c.samples),
        "--calibration-sequence-length", str(c.sequence_length),
        "--max-perplexity-increase", repr(q.max_perplexity_increase),
        "--canary-prompt", req.canary_prompt,
        "--canary-tokens", str(req.canary_tokens),
    ]  # fmt: skip
    if cfg.build.llm_perplexity_chunks:
        args += ["--perplexity-chunks", str(cfg.build.llm_perplexity_chunks)]
    return args + _common_args(req.backend, cfg)


def requested_threads(cpu: str) -> int:
    """Threads for a llama.cpp quantize or tune Job: the CPUs it requests (`build.cpu`), rounded up.
    The Job sets no CPU limit, so without this llama.cpp would spread over every core of the node,
    and a tune Job would measure settings on CPUs it does not hold (pure)."""
    return max(1, math.ceil(parse_quantity(cpu)))


def tune_args(req: TuneRequest, cfg: OperatorConfig) -> list[str]:
    args = ["trtforge", "tune", "--checkpoint", req.checkpoint_key, "--gpu", req.target.gpu]
    if req.target.mig:
        args += ["--mig", req.target.mig]
    args += ["--tensor", str(req.parallelism.tensor), "--pipeline", str(req.parallelism.pipeline)]
    if req.rebuild_of:
        args.append("--rebuild")
    args += ["--repetitions", str(cfg.build.llm_bench_repetitions)]
    return args + _common_args(req.backend, cfg)


def _common_args(backend: Backend, cfg: OperatorConfig) -> list[str]:
    args = ["--backend", backend.value]
    if backend is Backend.LLAMA_CPP:
        args += ["--threads", str(requested_threads(cfg.build.cpu))]
    if cfg.build.llama_bin_dir and backend is Backend.LLAMA_CPP:
        args += ["--llama-bin-dir", cfg.build.llama_bin_dir]
    return [*args, "--store", cfg.store_uri]


def llm_store_mounts(store_uri: str) -> list[dict[str, Any]]:
    """The build mounts (the model staging area read-only among them) plus the checkpoint and
    tuning folders read-write."""
    claim = _pvc_claim(store_uri) or ""
    prefix = store_uri.removeprefix("pvc://").strip("/").partition("/")[2]
    base = f"{PVC_ROOT}/{claim}" + (f"/{prefix}" if prefix else "")
    sub = f"{prefix}/" if prefix else ""
    extra = [
        {"name": "store", "mountPath": f"{base}/{d}", "subPath": f"{sub}{d}"}
        for d in sorted(set(KIND_DIRS.values()))
    ]
    return store_mounts(store_uri, staged_only=True) + extra


def _job(
    kind: str,
    name: str,
    job_id: str,
    args: list[str],
    requester: str,
    annotations: dict[str, str],
    cfg: OperatorConfig,
    *,
    target: GPUTarget | None,
    node_selector: dict[str, str],
    gpu_limits: dict[str, str],
    timeout_seconds: int,
    attempt: int,
    avoid_nodes: tuple[str, ...] = (),
) -> dict[str, Any]:
    labels = {
        **BASE_LABELS,
        APP_COMPONENT: COMPONENT_BUILDER,
        LABEL_BUILD_ID: job_id,
        LABEL_BUILD_KIND: kind,
        LABEL_REQUESTER_NAMESPACE: requester.split("/", 1)[0],
    }
    if target is not None:
        labels[LABEL_TARGET] = target.name
    annotations = {
        **annotations,
        requester_annotation(requester): requester,
        ANNOTATION_CREATED_FOR: requester,
        ANNOTATION_ATTEMPT: str(attempt),
    }
    volumes, mounts, env = job_scratch_and_env(cfg)
    claim = _pvc_claim(cfg.store_uri)
    if claim:
        volumes.append({"name": "store", "persistentVolumeClaim": {"claimName": claim}})
        mounts += llm_store_mounts(cfg.store_uri)
    if cfg.store_credentials_secret:
        from trtforge_operator.apply.children import S3_CREDENTIALS_DIR

        volumes.append({"name": "store-credentials", "secret": {"secretName": cfg.store_credentials_secret}})
        mounts.append({"name": "store-credentials", "mountPath": S3_CREDENTIALS_DIR, "readOnly": True})
        env.append({"name": "TRTFORGE_S3_CREDENTIALS_DIR", "value": S3_CREDENTIALS_DIR})
    env += [{"name": k, "value": v} for k, v in sorted(cfg.build.env.items())]
    resources: dict[str, Any] = {
        "requests": {"cpu": cfg.build.cpu, "memory": cfg.build.memory},
        "limits": {"memory": cfg.build.memory, **gpu_limits},
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": cfg.build_service_account,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "nodeSelector": node_selector,
        "containers": [
            container(kind, cfg.builder_image, cfg.image_pull_policy, args, env, resources, mounts)
        ],
        "volumes": volumes,
    }
    pod_spec.update(cfg.pod_defaults())
    affinity = _avoid_affinity(avoid_nodes)
    if affinity:
        pod_spec["affinity"] = affinity
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": cfg.build_namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": cfg.build.backoff_limit,
            "activeDeadlineSeconds": min(timeout_seconds, cfg.build.deadline_seconds),
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def quantize_job(req: QuantizeRequest, cfg: OperatorConfig) -> dict[str, Any]:
    """The quantize Job of one checkpoint key, in the build namespace. It needs no GPU on llama.cpp;
    on TensorRT-LLM, ModelOpt calibrates on the first GPU target's kind (a tune Job's selector)."""
    return _job(
        QUANTIZE,
        req.job_name,
        req.job_id,
        quantize_args(req, cfg),
        req.requester,
        {ANNOTATION_REQUEST_DIGEST: req.checkpoint_key},
        cfg,
        target=None,
        node_selector={},
        gpu_limits={},
        timeout_seconds=req.timeout_seconds,
        attempt=req.attempt,
    )


def tune_job(req: TuneRequest, cfg: OperatorConfig) -> dict[str, Any]:
    """The tune Job of one target: on the target's own kind of node and GPU (or MIG slice). A re-tune
    carries the kind and annotations of a rebuild Job and keeps off the nodes to avoid."""
    annotations = {
        ANNOTATION_REQUEST_DIGEST: req.checkpoint_key,
        ANNOTATION_TARGET: json.dumps(req.target.model_dump(mode="json"), sort_keys=True),
    }
    if req.rebuild_of:
        annotations[ANNOTATION_FAULT] = req.rebuild_of
        annotations[ANNOTATION_REBUILD_CAUSE] = "asked" if req.rebuild_asked else "fault"
    return _job(
        REBUILD if req.rebuild_of else TUNE,
        req.job_name,
        req.job_id,
        tune_args(req, cfg),
        req.requester,
        annotations,
        cfg,
        target=req.target,
        node_selector=dict(req.node_selector),
        gpu_limits={
            k: str(req.gpus or req.parallelism.world_size) for k in _gpu_limits(req.target, req.mig_strategy)
        },
        timeout_seconds=req.timeout_seconds,
        attempt=req.attempt,
        avoid_nodes=req.avoid_nodes,
    )
