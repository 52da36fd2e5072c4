"""Pure builders of the objects the operator owns: build Jobs, runtime Deployments, the Service.

Names are derived from their inputs (never ``generateName``), so a retry after a crash finds the object
it made before instead of making a second one (docs/design.md §"Components and data flow"). Every pod
is PSS-restricted.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trtforge.contract.engine_key import BuildConfig
from trtforge.contract.gpu import GPUTarget, MigStrategy
from trtforge.contract.layout import ENGINES, REQUESTS, TIMING_CACHES
from trtforge.contract.possession import MODELS, VerifyGrant
from trtforge.contract.termination import TERMINATION_LOG_ENV
from trtforge_operator.apply import front_proxy
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import (
    ANNOTATION_ATTEMPT,
    ANNOTATION_AVOID_NODES,
    ANNOTATION_CREATED_FOR,
    ANNOTATION_ENGINE_KEY,
    ANNOTATION_ENGINE_SHA256,
    ANNOTATION_FAULT,
    ANNOTATION_REBUILD_CAUSE,
    ANNOTATION_RECHECK_ROUND,
    ANNOTATION_REQUEST_DIGEST,
    ANNOTATION_SOURCE_FINGERPRINT,
    ANNOTATION_SPEC_HASH,
    ANNOTATION_TARGET,
    APP_COMPONENT,
    APP_NAME,
    BASE_LABELS,
    COMPONENT_BUILDER,
    COMPONENT_RUNTIME,
    COMPONENT_VERIFIER,
    GROUP,
    LABEL_BUILD_ID,
    LABEL_BUILD_KIND,
    LABEL_INFERENCEDEPLOYMENT,
    LABEL_MODEL_SOURCE,
    LABEL_REQUESTER_NAMESPACE,
    LABEL_TARGET,
    VERSION,
    requester_annotation,
)

TERMINATION_PATH = "/dev/termination-log"
JOB_PREFIX = "trtforge-build-"
TOKEN_DIR = "/var/run/secrets/trtforge"
TOKEN_FILE = "broker-token"
TOKEN_ENV = "TRTFORGE_BROKER_TOKEN_FILE"
PVC_ROOT = "/mnt/trtforge/pvc"
S3_CREDENTIALS_DIR = "/var/run/secrets/trtforge-store"
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def short_hash(*parts: str, n: int = 10) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:n]


def dns_name(base: str, max_len: int = 63) -> str:
    """`base` as a DNS-1123 label of at most `max_len`, shortened with a hash suffix when needed."""
    slug = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-") or "x"
    if len(slug) <= max_len:
        return slug
    h = short_hash(slug, n=8)
    return f"{slug[: max_len - 9].rstrip('-')}-{h}"


def build_id(engine_key: str | None, request_digest: str) -> str:
    """What names a build: the request key for a first build, the engine key for a fault rebuild."""
    return (engine_key or request_digest)[:20]


def job_name(bid: str, attempt: int = 1, rebuild_of: str | None = None, *, asked: bool = False) -> str:
    """`trtforge-build-<id>`; later attempts get `-a<n>`, fault rebuilds `-rb<fault hash>`, rebuilds a
    tenant asked for `-rq<ask hash>` (never the name of a fault rebuild, whatever the ask says)."""
    if rebuild_of:
        return f"{JOB_PREFIX}{bid}-{'rq' if asked else 'rb'}{rebuild_of[:8]}"
    return f"{JOB_PREFIX}{bid}" if attempt <= 1 else f"{JOB_PREFIX}{bid}-a{attempt}"


def restricted_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container(
    name: str,
    image: str,
    image_pull_policy: str,
    command: list[str],
    env: list[dict[str, Any]],
    resources: dict[str, Any],
    mounts: list[dict[str, Any]],
    **fields: Any,
) -> dict[str, Any]:
    """A PSS-restricted container that leaves its result where the operator reads it (termination message)."""
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "command": command,
        "env": env,
        **fields,
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": restricted_security_context(),
        "terminationMessagePath": TERMINATION_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pvc_claim(uri: str) -> str | None:
    if uri.startswith("pvc://"):
        return uri.removeprefix("pvc://").split("/", 1)[0] or None
    return None


def store_mounts(store_uri: str, *, staged_only: bool = True) -> list[dict[str, Any]]:
    """A build's mounts of the store claim (volume "store"), least access: engines, the request index
    and timing caches read-write, the model staging area read-only, nothing else (no possession
    records); the store root stays unmounted, so a build cannot reach any other path of the claim."""
    claim = _pvc_claim(store_uri) or ""
    prefix = store_uri.removeprefix("pvc://").strip("/").partition("/")[2]
    base = f"{PVC_ROOT}/{claim}" + (f"/{prefix}" if prefix else "")
    sub = f"{prefix}/" if prefix else ""
    out: list[dict[str, Any]] = [
        {"name": "store", "mountPath": f"{base}/{d}", "subPath": f"{sub}{d}"}
        for d in (ENGINES, REQUESTS, TIMING_CACHES)
    ]
    if staged_only:
        out.append(
            {"name": "store", "mountPath": f"{base}/{MODELS}", "subPath": f"{sub}{MODELS}", "readOnly": True}
        )
    return out


def _avoid_affinity(avoid_nodes: Iterable[str]) -> dict[str, Any] | None:
    """Keep pods off these nodes: one NotIn per node (a node field selector takes exactly one value)."""
    nodes = sorted(set(avoid_nodes))
    if not nodes:
        return None
    term = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in nodes]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def _gpu_limits(
    target: GPUTarget, strategy: MigStrategy = MigStrategy.MIXED, count: int = 1
) -> dict[str, str]:
    res = target.resource_name(strategy)
    return {res: str(count)} if res else {}


def _shape(s: Iterable[int]) -> str:
    return "x".join(str(d) for d in s)


@dataclass(frozen=True)
class BuildRequest:
    """One build of one target: what the Job runs and who asked for it."""

    target: GPUTarget
    model_uri: str
    model_sha256: str | None
    build: BuildConfig
    engine_key: str | None  # known when the model sha256 is pinned
    request_digest: str
    node_selector: Mapping[str, str]
    requester: str  # "namespace/name" of the TRTEngine
    timing_cache: bool = True
    timeout_seconds: int = 3600
    samples: int = 8
    rtol: float | None = None
    atol: float | None = None
    attempt: int = 1
    rebuild_of: str | None = None  # a fault id: a fresh rebuild that must not trust the stored artifact
    rebuild_asked: bool = False  # a rebuild its TRTEngine's annotation asked for, not a fault's
    avoid_nodes: tuple[str, ...] = ()
    backend: str = "auto"  # the backend the key was computed for
    # The model comes from the store's staging area (models/<model_sha256>/), put there by the broker
    # after the tenant's verify step; the build then needs neither the tenant's claim nor its Secret.
    staged_model: bool = False
    cache_scope: str = ""  # the requesting namespace's cache scope (part of the store key)
    mig_strategy: MigStrategy = MigStrategy.MIXED  # how the node offers a MIG slice (its resource)

    @property
    def build_id(self) -> str:
        return build_id(self.engine_key, self.request_digest)

    @property
    def job_name(self) -> str:
        return job_name(self.build_id, self.attempt, self.rebuild_of, asked=self.rebuild_asked)


def builder_args(req: BuildRequest, store_uri: str) -> list[str]:
    """The `trtforge build` command line for a request."""
    b = req.build
    args = ["trtforge", "build", "--model", req.model_uri, "--gpu", req.target.gpu]
    if req.target.mig:
        args += ["--mig", req.target.mig]
    if req.model_sha256:
        args += ["--sha256", req.model_sha256]
    args += ["--precision", b.precision, "--optimization-level", str(b.optimization_level)]
    for profile in b.profiles:
        for name, r in sorted(profile.items()):
            args += ["--profile", f"{name}:{_shape(r.min)}:{_shape(r.opt)}:{_shape(r.max)}"]
    if b.workspace_bytes is not None:
        args += ["--workspace", str(b.workspace_bytes)]
    if b.hardware_compatibility != "none":
        args += ["--hardware-compatibility", b.hardware_compatibility]
    if b.version_compatible:
        args.append("--version-compatible")
    if b.strip_weights:
        args.append("--strip-weights")
    if not req.timing_cache:
        args.append("--no-timing-cache")
    args += ["--samples", str(req.samples)]
    if req.rtol is not None:
        args += ["--rtol", repr(req.rtol)]
    if req.atol is not None:
        args += ["--atol", repr(req.atol)]
    # Finish (with a clean Timeout result) before the Job's deadline kills the pod.
    args += ["--timeout", str(max(30, req.timeout_seconds - 30)), "--backend", req.backend]
    if req.rebuild_of:
        args.append("--rebuild")
    if req.staged_model:
        args.append("--staged-model")
    if req.cache_scope:
        args += ["--cache-scope", req.cache_scope]
    args += ["--request-key", req.request_digest, "--store", store_uri]
    return args


_Dicts = list[dict[str, Any]]


def job_scratch_and_env(cfg: OperatorConfig) -> tuple[_Dicts, _Dicts, _Dicts]:
    """What every forge Job's pod starts with: its scratch volume and mount at /tmp, and the
    environment that names its termination log and the store claim's mount point."""
    volumes: list[dict[str, Any]] = [{"name": "scratch", "emptyDir": {"sizeLimit": cfg.build.scratch_size}}]
    mounts: list[dict[str, Any]] = [{"name": "scratch", "mountPath": "/tmp"}]
    env = [
        {"name": TERMINATION_LOG_ENV, "value": TERMINATION_PATH},
        {"name": "TRTFORGE_PVC_ROOT", "value": PVC_ROOT},
        {"name": "HOME", "value": "/tmp"},
    ]
    return volumes, mounts, env


def build_job(req: BuildRequest, cfg: OperatorConfig) -> dict[str, Any]:
    """The build Job for one request, in the build namespace (shared cache: no cross-namespace owners)."""
    labels = {
        **BASE_LABELS,
        APP_COMPONENT: COMPONENT_BUILDER,
        LABEL_BUILD_ID: req.build_id,
        LABEL_BUILD_KIND: "rebuild" if req.rebuild_of else "build",
        LABEL_TARGET: req.target.name,
        LABEL_REQUESTER_NAMESPACE: req.requester.split("/", 1)[0],
    }
    annotations = {
        ANNOTATION_ENGINE_KEY: req.engine_key or "",
        ANNOTATION_REQUEST_DIGEST: req.request_digest,
        requester_annotation(req.requester): req.requester,
        ANNOTATION_CREATED_FOR: req.requester,
        ANNOTATION_ATTEMPT: str(req.attempt),
        ANNOTATION_TARGET: json.dumps(req.target.model_dump(mode="json"), sort_keys=True),
    }
    if req.rebuild_of:
        annotations[ANNOTATION_FAULT] = req.rebuild_of
        annotations[ANNOTATION_REBUILD_CAUSE] = "asked" if req.rebuild_asked else "fault"
    volumes, mounts, env = job_scratch_and_env(cfg)
    store_claim = _pvc_claim(cfg.store_uri)
    if store_claim:
        volumes.append({"name": "store", "persistentVolumeClaim": {"claimName": store_claim}})
        mounts += store_mounts(cfg.store_uri, staged_only=req.staged_model)
    model_claim = _pvc_claim(req.model_uri)
    if not req.staged_model and model_claim and model_claim != store_claim:
        # Only for a build not staged through the broker (a single-tenant install's own claim).
        volumes.append(
            {"name": "model", "persistentVolumeClaim": {"claimName": model_claim, "readOnly": True}}
        )
        mounts.append({"name": "model", "mountPath": f"{PVC_ROOT}/{model_claim}", "readOnly": True})
    if cfg.store_credentials_secret:
        volumes.append({"name": "store-credentials", "secret": {"secretName": cfg.store_credentials_secret}})
        mounts.append({"name": "store-credentials", "mountPath": S3_CREDENTIALS_DIR, "readOnly": True})
        env.append({"name": "TRTFORGE_S3_CREDENTIALS_DIR", "value": S3_CREDENTIALS_DIR})
    env += [{"name": k, "value": v} for k, v in sorted(cfg.build.env.items())]
    resources: dict[str, Any] = {
        "requests": {"cpu": cfg.build.cpu, "memory": cfg.build.memory},
        "limits": {"memory": cfg.build.memory, **_gpu_limits(req.target, req.mig_strategy)},
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": cfg.build_service_account,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "nodeSelector": dict(req.node_selector),
        "containers": [
            container(
                "build",
                cfg.builder_image,
                cfg.image_pull_policy,
                builder_args(req, cfg.store_uri),
                env,
                resources,
                mounts,
            )
        ],
        "volumes": volumes,
    }
    pod_spec.update(cfg.pod_defaults())  # tolerations (the GPU taint), image pull secrets
    affinity = _avoid_affinity(req.avoid_nodes)
    if affinity:
        pod_spec["affinity"] = affinity
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": req.job_name,
            "namespace": cfg.build_namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "backoffLimit": cfg.build.backoff_limit,
            "activeDeadlineSeconds": min(req.timeout_seconds, cfg.build.deadline_seconds),
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


# ----------------------------------------------------------------------------------------- verify

VERIFY_PREFIX = "trtforge-verify-"
VERIFY_GRANT_SLACK_S = 300.0  # a grant outlives its Job's deadline by this much (Job start, clock skew)


def verify_job_name(fingerprint: str, attempt: int = 1, round_: str = "") -> str:
    """`trtforge-verify-<fingerprint[:20]>`, a re-read `-<round>`, later attempts `-a<n>` (one per
    source, round and attempt)."""
    base = f"{VERIFY_PREFIX}{fingerprint[:20]}" + (f"-{round_}" if round_ else "")
    return base if attempt <= 1 else f"{base}-a{attempt}"


@dataclass(frozen=True)
class VerifyRequest:
    """Prove that a tenant namespace holds its model: read it with the tenant's own source and
    credentials, in the tenant's namespace, and stream it to the broker, which hashes it."""

    namespace: str
    engine: str  # the TRTEngine that asked (owner of the Job: deleted with it)
    engine_uid: str
    model_uri: str
    model_sha256: str | None
    secret: str | None  # spec.model.secretRef: the tenant's own Secret, in its own namespace
    fingerprint: str
    attempt: int = 1
    max_bytes: int | None = None  # spec.model.maxSizeBytes
    allowed_redirect_hosts: tuple[str, ...] = ()  # spec.model.allowedRedirectHosts
    round_: str = ""  # a re-read of a verified model (spec.model.recheckInterval): which one
    model_format: str = "onnx"  # what the bytes must be: onnx, or gguf (spec.llm.source.format)

    @property
    def job_name(self) -> str:
        return verify_job_name(self.fingerprint, self.attempt, self.round_)


def verify_command(req: VerifyRequest, cfg: OperatorConfig) -> list[str]:
    """The verify container's command line (the broker checks the uploading pod runs exactly this)."""
    args = ["trtforge", "stage-model", "--model", req.model_uri, "--broker", cfg.broker_url()]
    if req.model_sha256:
        args += ["--sha256", req.model_sha256]
    if req.secret:
        args += ["--secret-name", req.secret]
    for host in req.allowed_redirect_hosts:
        args += ["--allow-redirect-host", host]
    if req.model_format != "onnx":
        args += ["--format", req.model_format]
    return args


def verify_grant(req: VerifyRequest, cfg: OperatorConfig, now: float, job_uid: str = "") -> VerifyGrant:
    """The operator's record of the verify Job it creates for `req` (docs/security.md): the broker
    takes an upload only from that Job's pod, for this source, at most `max_bytes`, once."""
    cap = cfg.broker.max_model_bytes
    pod = verify_job(req, cfg)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    return VerifyGrant(
        namespace=req.namespace,
        job=req.job_name,
        job_uid=job_uid,
        engine=req.engine,
        fingerprint=req.fingerprint,
        uri=req.model_uri,
        secret=req.secret or "",
        pin=req.model_sha256 or "",
        max_bytes=min(req.max_bytes, cap) if req.max_bytes else cap,
        format="gguf" if req.model_format == "gguf" else "onnx",  # what the broker checks the bytes are
        image=cfg.builder_image,
        command=c["command"],
        env=c["env"],
        env_from=c.get("envFrom") or [],
        volume_mounts=c["volumeMounts"],
        volumes=pod["volumes"],
        issued_at=now,
        expires_at=now + cfg.verify.deadline_seconds + VERIFY_GRANT_SLACK_S,
    )


def broker_token_volume(cfg: OperatorConfig) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(volume, mount, env) of the projected service-account token for the broker's audience."""
    volume = {
        "name": "broker-token",
        "projected": {
            "sources": [
                {
                    "serviceAccountToken": {
                        "audience": cfg.broker.audience,
                        "expirationSeconds": cfg.broker.token_expiration_seconds,
                        "path": TOKEN_FILE,
                    }
                }
            ]
        },
    }
    mount = {"name": "broker-token", "mountPath": TOKEN_DIR, "readOnly": True}
    return volume, mount, {"name": TOKEN_ENV, "value": f"{TOKEN_DIR}/{TOKEN_FILE}"}


def verify_job(req: VerifyRequest, cfg: OperatorConfig) -> dict[str, Any]:
    """The verify Job, in the tenant's namespace, under its runtime ServiceAccount (no API rights).

    It mounts the model's claim (one of the tenant's own) read-only, takes s3/https credentials from
    the tenant's own Secret, and holds nothing of the store: it reaches the store only through the
    broker, which accepts bytes whose sha256 it computes itself."""
    labels = {
        **BASE_LABELS,
        APP_COMPONENT: COMPONENT_VERIFIER,
        LABEL_MODEL_SOURCE: req.fingerprint[:20],
    }
    annotations = {
        ANNOTATION_SOURCE_FINGERPRINT: req.fingerprint,
        ANNOTATION_ATTEMPT: str(req.attempt),
        ANNOTATION_CREATED_FOR: f"{req.namespace}/{req.engine}",
    }
    if req.round_:
        annotations[ANNOTATION_RECHECK_ROUND] = req.round_
    token_volume, token_mount, token_env = broker_token_volume(cfg)
    volumes: list[dict[str, Any]] = [
        {"name": "scratch", "emptyDir": {"sizeLimit": cfg.build.scratch_size}},
        token_volume,
    ]
    mounts: list[dict[str, Any]] = [{"name": "scratch", "mountPath": "/tmp"}, token_mount]
    env = [
        {"name": TERMINATION_LOG_ENV, "value": TERMINATION_PATH},
        {"name": "TRTFORGE_PVC_ROOT", "value": PVC_ROOT},
        {"name": "HOME", "value": "/tmp"},
        token_env,
    ]
    claim = _pvc_claim(req.model_uri)
    if claim:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": f"{PVC_ROOT}/{claim}", "readOnly": True})
    args = verify_command(req, cfg)
    env_from = [{"secretRef": {"name": req.secret}}] if req.secret else []
    resources = {
        "requests": {"cpu": cfg.verify.cpu, "memory": cfg.verify.memory},
        "limits": {"memory": cfg.verify.memory},
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": cfg.runtime_service_account,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [
            container(
                "verify",
                cfg.builder_image,
                cfg.image_pull_policy,
                args,
                env,
                resources,
                mounts,
                **({"envFrom": env_from} if env_from else {}),
            )
        ],
        "volumes": volumes,
        **cfg.pod_defaults(),  # the builder image, in the tenant's namespace: pull secrets, tolerations
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": req.job_name,
            "namespace": req.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {**owner_reference("TRTEngine", req.engine, req.engine_uid), "controller": False}
            ],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": cfg.verify.deadline_seconds,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


# ---------------------------------------------------------------------------------------------- runtime


def deployment_name(infd: str, target: GPUTarget) -> str:
    return dns_name(f"{infd}-{target.name}", max_len=52)


def service_name(infd: str) -> str:
    return infd if len(infd) <= 63 and DNS_LABEL.match(infd) else dns_name(f"infd-{infd}")


def selector_labels(infd: str, target: GPUTarget | None = None) -> dict[str, str]:
    sel = {APP_NAME: "trtforge", LABEL_INFERENCEDEPLOYMENT: dns_name(infd)}
    if target is not None:
        sel[LABEL_TARGET] = target.name
    return sel


def selector_text(infd: str) -> str:
    """The runtime pods' label selector as text (``k=v,k=v``): the scale subresource's selector."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(infd).items()))


@dataclass(frozen=True)
class RuntimeRequest:
    """One runtime Deployment: an InferenceDeployment's pods on one target."""

    namespace: str
    infd: str
    infd_uid: str
    target: GPUTarget
    engine_key: str
    engine_sha256: str
    replicas: int
    node_selector: Mapping[str, str]
    image: str
    image_pull_policy: str
    port: int = 8000
    grpc_port: int = 8001
    max_batch_size: int = 1
    max_queue_delay_us: int = 0
    instances: int | None = None  # None: the runtime's default
    workers: int | None = None  # None: the runtime's default (auto)
    resources: Mapping[str, Any] | None = None
    env: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    mig_strategy: MigStrategy = MigStrategy.MIXED
    max_surge: int | str = "25%"
    max_unavailable: int | str = 0
    progress_deadline_seconds: int = 600
    avoid_nodes: tuple[str, ...] = ()
    # An HPA sets the replicas: they are left out of the spec hash (a new count from the HPA or from
    # spec.replicas is no reason to write), and a replace keeps the Deployment's own number.
    hpa_owned: bool = False
    gpus: int = 1  # per pod: an LLM mapping that fits one node takes tensor x pipeline of its GPUs
    # An LLM engine's container (apply/llm_children.py): its command, its ports beside `http` (which
    # carries the probes either way) and pod-template annotations, instead of `trtforge serve`'s.
    command: tuple[str, ...] = ()
    extra_ports: tuple[Mapping[str, Any], ...] = ()
    template_annotations: Mapping[str, str] | None = None


def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def spec_hash(obj: Mapping[str, Any]) -> str:
    return short_hash(json.dumps(obj, sort_keys=True, default=str), n=16)


def runtime_deployment(req: RuntimeRequest, cfg: OperatorConfig) -> dict[str, Any]:
    """The runtime Deployment of one target; the template changes (and rolls) when the engine does."""
    sel = selector_labels(req.infd, req.target)
    labels = {**BASE_LABELS, **sel, APP_COMPONENT: COMPONENT_RUNTIME}
    template_annotations = {
        ANNOTATION_ENGINE_KEY: req.engine_key,
        ANNOTATION_ENGINE_SHA256: req.engine_sha256,
        **(req.template_annotations or {}),
    }
    source = cfg.engine_source()
    args = [
        "trtforge",
        "serve",
        "--store",
        source,
        "--engine",
        req.engine_key,
        "--model-name",
        req.infd,
        "--host",
        "$(POD_IP)",
        "--port",
        str(req.port),
        "--grpc-port",
        str(req.grpc_port),
        "--max-batch-size",
        str(req.max_batch_size),
        "--max-queue-delay-us",
        str(req.max_queue_delay_us),
        "--cache-dir",
        "/cache",
    ]
    if req.instances is not None:
        args += ["--instances", str(req.instances)]
    if req.workers is not None:
        args += ["--workers", str(req.workers)]
    ports: list[dict[str, Any]] = [{"name": "http", "containerPort": req.port, "protocol": "TCP"}]
    if req.command:  # an LLM engine's `trtforge serve-llm`
        args = list(req.command)
        ports += [dict(p) for p in req.extra_ports]
    else:
        ports.append({"name": "grpc", "containerPort": req.grpc_port, "protocol": "TCP"})
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": TERMINATION_LOG_ENV, "value": TERMINATION_PATH},
        {"name": "HOME", "value": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [{"name": "cache", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [
        {"name": "cache", "mountPath": "/cache"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if source.startswith(("http://", "https://")):
        token_volume, token_mount, token_env = broker_token_volume(cfg)
        env.append(token_env)
        volumes.append(token_volume)
        mounts.append(token_mount)
    env += [dict(e) for e in req.env]
    resources = {k: dict(v) for k, v in (req.resources or {}).items() if v}
    limits = {**resources.get("limits", {}), **_gpu_limits(req.target, req.mig_strategy, req.gpus)}
    if limits:
        resources["limits"] = limits
    probe_base = {"httpGet": {"path": "/v2/health/ready", "port": req.port}}
    pod_spec: dict[str, Any] = {
        "serviceAccountName": cfg.runtime_service_account,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "nodeSelector": dict(req.node_selector),
        "terminationGracePeriodSeconds": 30,
        "containers": [
            container(
                "serve",
                req.image,
                req.image_pull_policy,
                args,
                env,
                resources,
                mounts,
                ports=ports,
                readinessProbe={**probe_base, "periodSeconds": 2, "failureThreshold": 2},
                livenessProbe={
                    "httpGet": {"path": "/v2/health/live", "port": req.port},
                    "initialDelaySeconds": 10,
                    "periodSeconds": 10,
                    "failureThreshold": 3,
                },
            )
        ],
        "volumes": volumes,
    }
    if cfg.front_proxy.enabled and not req.command:  # not an LLM's: no hop on its token path
        front_proxy.add_front_proxy(
            pod_spec,
            template_annotations,
            cfg.front_proxy,
            http_port=req.port,
            grpc_port=req.grpc_port,
            configmap=front_proxy.configmap_name(deployment_name(req.infd, req.target)),
        )
    pod_spec.update(cfg.pod_defaults())
    tolerations = pod_spec.get("tolerations", []) + [
        dict(t) for t in req.tolerations if dict(t) not in pod_spec.get("tolerations", [])
    ]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    affinity = _avoid_affinity(req.avoid_nodes)
    if affinity:
        pod_spec["affinity"] = affinity
    spec: dict[str, Any] = {
        "replicas": req.replicas,
        "selector": {"matchLabels": sel},
        "progressDeadlineSeconds": req.progress_deadline_seconds,
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": req.max_surge, "maxUnavailable": req.max_unavailable},
        },
        "template": {"metadata": {"labels": labels, "annotations": template_annotations}, "spec": pod_spec},
    }
    hashed = {k: v for k, v in spec.items() if k != "replicas"} if req.hpa_owned else spec
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": deployment_name(req.infd, req.target),
            "namespace": req.namespace,
            "labels": labels,
            "annotations": {
                ANNOTATION_SPEC_HASH: spec_hash(hashed),
                ANNOTATION_AVOID_NODES: ",".join(sorted(req.avoid_nodes)),
            },
            "ownerReferences": [owner_reference("InferenceDeployment", req.infd, req.infd_uid)],
        },
        "spec": spec,
    }


def runtime_service(namespace: str, infd: str, infd_uid: str, port: int, grpc_port: int) -> dict[str, Any]:
    """One Service over every target's pods of an InferenceDeployment: HTTP and gRPC (KServe v2)."""
    spec = {
        "selector": selector_labels(infd),
        "ports": [
            {"name": "http", "port": port, "targetPort": port, "protocol": "TCP"},
            {"name": "grpc", "port": grpc_port, "targetPort": grpc_port, "protocol": "TCP"},
        ],
    }
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(infd),
            "namespace": namespace,
            "labels": {
                **BASE_LABELS,
                LABEL_INFERENCEDEPLOYMENT: dns_name(infd),
                APP_COMPONENT: COMPONENT_RUNTIME,
            },
            "annotations": {ANNOTATION_SPEC_HASH: spec_hash(spec)},
            "ownerReferences": [owner_reference("InferenceDeployment", infd, infd_uid)],
        },
        "spec": spec,
    }


# ------------------------------------------------------------------------------------------ autoscaler


def _deployment_ref(infd: str, target: GPUTarget) -> dict[str, str]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment_name(infd, target)}


def infd_scale_ref(infd: str) -> dict[str, str]:
    """The InferenceDeployment itself as a scale target (its scale subresource)."""
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceDeployment", "name": infd}


@dataclass(frozen=True)
class AutoscalerRequest:
    """The HorizontalPodAutoscaler of one target Deployment."""

    namespace: str
    infd: str
    infd_uid: str
    target: GPUTarget
    api_version: str  # autoscaling/v2 or autoscaling/v2beta2 (the same shape for what is written here)
    min_replicas: int
    max_replicas: int
    metric: str  # its name in the custom metrics API
    target_value: str  # average per pod, a quantity
    # What it scales: the target's Deployment, or (rank groups) the InferenceDeployment's scale
    # subresource, whose selector names the groups' leaders (docs/llm.md §"Groups").
    scale_target: Mapping[str, str] | None = None


def autoscaler_name(infd: str, target: GPUTarget) -> str:
    """The HPA of a target is named as its Deployment."""
    return deployment_name(infd, target)


def runtime_autoscaler(req: AutoscalerRequest) -> dict[str, Any]:
    """An HPA scaling one target Deployment on a per-pod custom metric (type Pods, AverageValue)."""
    spec = {
        "scaleTargetRef": dict(req.scale_target or _deployment_ref(req.infd, req.target)),
        "minReplicas": req.min_replicas,
        "maxReplicas": req.max_replicas,
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": req.metric},
                    "target": {"type": "AverageValue", "averageValue": req.target_value},
                },
            }
        ],
    }
    return {
        "apiVersion": req.api_version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": {
            "name": autoscaler_name(req.infd, req.target),
            "namespace": req.namespace,
            "labels": {
                **BASE_LABELS,
                **selector_labels(req.infd, req.target),
                APP_COMPONENT: COMPONENT_RUNTIME,
            },
            "annotations": {ANNOTATION_SPEC_HASH: spec_hash({"apiVersion": req.api_version, **spec})},
            "ownerReferences": [owner_reference("InferenceDeployment", req.infd, req.infd_uid)],
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class ScaledObjectRequest:
    """The KEDA ScaledObject of one target Deployment (``provider: KEDA``)."""

    namespace: str
    infd: str
    infd_uid: str
    target: GPUTarget
    min_replicas: int
    max_replicas: int
    server_address: str  # the Prometheus the trigger queries
    query: str  # PromQL: the metric summed over the target's pods
    threshold: str  # the per-pod average to hold (a plain decimal)
    scale_target: Mapping[str, str] | None = None  # as AutoscalerRequest's


def runtime_scaled_object(req: ScaledObjectRequest) -> dict[str, Any]:
    """A KEDA ScaledObject (keda.sh/v1alpha1) scaling one target Deployment with a prometheus trigger.
    Its metric type is AverageValue: the HPA that KEDA makes divides the query's sum by the pod count,
    so ``threshold`` is per pod, as the operator's own HPA's target is. Named as its Deployment."""
    spec = {
        "scaleTargetRef": dict(req.scale_target or _deployment_ref(req.infd, req.target)),
        "minReplicaCount": req.min_replicas,
        "maxReplicaCount": req.max_replicas,
        "triggers": [
            {
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": req.server_address,
                    "query": req.query,
                    "threshold": req.threshold,
                },
            }
        ],
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": autoscaler_name(req.infd, req.target),
            "namespace": req.namespace,
            "labels": {
                **BASE_LABELS,
                **selector_labels(req.infd, req.target),
                APP_COMPONENT: COMPONENT_RUNTIME,
            },
            "annotations": {ANNOTATION_SPEC_HASH: spec_hash(spec)},
            "ownerReferences": [owner_reference("InferenceDeployment", req.infd, req.infd_uid)],
        },
        "spec": spec,
    }
