"""Typed, read-only views of what the planners look at: Jobs, Pods, Nodes, Deployments, and one
TRTEngine pass's whole observation (:class:`EngineObserved`).

Built from raw API dicts (kopf bodies or client responses) with ``*.from_k8s``; the pure planners take
only these, so unit tests build them from small literal dicts. What a finished build or verify pod
reported is parsed here, once per pod event, from its typed termination message (a fact of the
view, never re-read from text by a planner). The gathering itself is observe/engine.py's.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from trtforge.contract.build_result import BuildFailure, BuildResult, parse_build_message
from trtforge.contract.engine_key import RequestRecord
from trtforge.contract.gpu import (
    LABEL_ARCH,
    LABEL_CC_MAJOR,
    LABEL_CC_MINOR,
    LABEL_MIG_CONFIG_STATE,
    LABEL_PRODUCT,
    RESOURCE_GPU,
    GPUTarget,
    MigStrategy,
    mig_profile_of_resource,
    node_mig_strategy,
    single_strategy_product,
)
from trtforge.contract.llm.artefact import ArtefactManifest
from trtforge.contract.llm.result import QuantizeFailure, QuantizeResult, TuneResult, parse_llm_message
from trtforge.contract.manifest import Manifest
from trtforge.contract.possession import PossessionRecord, source_fingerprint
from trtforge.contract.quantity import quantity_to_bytes
from trtforge.contract.termination import REASON_BY_EXIT_CODE, TerminationMessage
from trtforge_operator import pod_spec
from trtforge_operator.api.inferencedeployment import (
    FaultRecord,
    InferenceDeploymentSpec,
    InferenceDeploymentStatus,
    NodeProblem,
)
from trtforge_operator.api.trtengine import TargetStatus, TRTEngine, TRTEngineSpec, TRTEngineStatus
from trtforge_operator.labels import (
    ANNOTATION_ATTEMPT,
    ANNOTATION_CREATED_FOR,
    ANNOTATION_ENGINE_KEY,
    ANNOTATION_REBUILD_CAUSE,
    ANNOTATION_REQUEST_DIGEST,
    ANNOTATION_RESULT,
    LABEL_BUILD_ID,
    LABEL_BUILD_KIND,
    REQUESTER_PREFIX,
)

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# Taints and Node conditions that say a node's GPUs are not healthy (GPU health checkers, NPD).
GPU_HEALTH_TAINTS = frozenset(
    {"nvidia.com/gpu.unhealthy", "nvidia.com/gpu-unhealthy", "nvidia.com/gpu.health"}
)
GPU_UNHEALTHY_CONDITIONS = frozenset(
    {"GpuUnhealthy", "GPUUnhealthy", "NvidiaGPUUnhealthy", "XidCriticalError"}
)

Reported = BuildResult | BuildFailure | QuantizeResult | TuneResult
"""What a build, quantize or tune pod reported (its termination message)."""


def llm_result(message: str) -> QuantizeResult | TuneResult | QuantizeFailure | None:
    """A quantize or tune pod's result, or an accuracy-gate refusal with its figures (other
    failures parse as build failures)."""
    r = parse_llm_message(message)
    if isinstance(r, QuantizeFailure):
        return r if r.perplexity is not None else None
    return r


def parse_time(value: Any) -> float | None:
    """RFC 3339 (as the apiserver writes it) to epoch seconds; None when absent or unreadable."""
    if not value:
        return None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    try:
        return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def utc(epoch: float) -> dt.datetime:
    """Epoch seconds as a UTC datetime to the second (how status times are written)."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).replace(microsecond=0)


def _qty_int(v: Any) -> int:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return 0


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _ready(conditions: list[Mapping[str, Any]]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _nvidia_quantities(resources: Mapping[str, Any] | None) -> dict[str, int]:
    """The nvidia.com/* entries of a Node's capacity or allocatable, as counts."""
    return {k: _qty_int(v) for k, v in (resources or {}).items() if k.startswith("nvidia.com/")}


def memory_bytes(resources: Mapping[str, Any] | None) -> int | None:
    """The `memory` entry of a Node's capacity or allocatable, in bytes; None when absent or unreadable."""
    raw = (resources or {}).get("memory")
    try:
        return quantity_to_bytes(raw) if raw is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    capacity: Mapping[str, int]
    allocatable: Mapping[str, int]
    taint_keys: frozenset[str] = frozenset()
    ready: bool = True
    unschedulable: bool = False
    bad_conditions: tuple[str, ...] = ()
    # status.allocatable.memory in bytes (capacity less the kubelet's reservations); None when absent
    # or not a quantity. The GH200 host tier is sized from it (planning/host_cache.py).
    allocatable_memory_bytes: int | None = None

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> NodeView:
        meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
        conds = status.get("conditions") or []
        bad = tuple(
            sorted(
                c["type"]
                for c in conds
                if c.get("type") in GPU_UNHEALTHY_CONDITIONS and c.get("status") == "True"
            )
        )
        return cls(
            name=meta.get("name", ""),
            labels=dict(meta.get("labels") or {}),
            capacity=_nvidia_quantities(status.get("capacity")),
            allocatable=_nvidia_quantities(status.get("allocatable")),
            taint_keys=frozenset(t.get("key", "") for t in spec.get("taints") or []),
            ready=_ready(conds),
            unschedulable=bool(spec.get("unschedulable")),
            bad_conditions=bad,
            allocatable_memory_bytes=memory_bytes(status.get("allocatable")),
        )

    @property
    def mig_strategy(self) -> MigStrategy:
        return node_mig_strategy(self.labels)

    @property
    def product(self) -> str | None:
        """The GPU product, without the `-MIG-<profile>` the single MIG strategy adds to its label."""
        label = self.labels.get(LABEL_PRODUCT)
        if label and self.mig_strategy == MigStrategy.SINGLE:
            parsed = single_strategy_product(label)
            return parsed[0] if parsed else label
        return label

    @property
    def arch(self) -> str | None:
        return self.labels.get(LABEL_ARCH)

    @property
    def compute_capability(self) -> str | None:
        major, minor = self.labels.get(LABEL_CC_MAJOR), self.labels.get(LABEL_CC_MINOR)
        return f"{major}.{minor}" if major and minor else None

    def mig_ready(self) -> bool:
        return self.labels.get(LABEL_MIG_CONFIG_STATE) == "success"

    def mig_profiles(self) -> list[str]:
        return sorted(
            mig_profile_of_resource(k.removeprefix(MIG_RESOURCE_PREFIX))
            for k, v in self.capacity.items()
            if k.startswith(MIG_RESOURCE_PREFIX) and v > 0
        )

    def targets(self) -> list[GPUTarget]:
        """GPU targets this node can host: under the single MIG strategy its one slice profile; else
        whole GPUs and (mixed strategy) the slices of a MIG config that succeeded."""
        product = self.product
        if not product:
            return []
        if self.mig_strategy == MigStrategy.SINGLE:
            parsed = single_strategy_product(self.labels.get(LABEL_PRODUCT, ""))
            if parsed is None or self.capacity.get(RESOURCE_GPU, 0) <= 0:
                return []
            try:
                return [GPUTarget(gpu=product, mig=parsed[1])]
            except ValueError:
                return []
        out = []
        if self.capacity.get(RESOURCE_GPU, 0) > 0:
            out.append(GPUTarget(gpu=product))
        if self.mig_ready():
            for p in self.mig_profiles():
                try:
                    out.append(GPUTarget(gpu=product, mig=p))
                except ValueError:
                    continue
        return out

    def hosts(self, target: GPUTarget) -> bool:
        """Whether a pod for `target` may land here (labels and a non-zero capacity of its resource)."""
        if target.is_cpu:
            return not self.product
        if self.product != target.gpu:
            return False
        if self.mig_strategy == MigStrategy.SINGLE:
            return target in self.targets()
        res = target.resource_name()
        if target.mig and not self.mig_ready():
            return False
        return res is not None and self.capacity.get(res, 0) > 0

    def gpu_problem(self) -> GPUProblem | None:
        """Why this node's GPUs cannot be trusted right now, or None when they look healthy."""
        if not self.ready:
            return GPUProblem(NodeProblem.NOT_READY)
        for key in sorted(self.taint_keys & GPU_HEALTH_TAINTS):
            return GPUProblem(NodeProblem.GPU_HEALTH_TAINT, key)
        if self.bad_conditions:
            return GPUProblem(NodeProblem.NODE_CONDITION, self.bad_conditions[0])
        for res, cap in sorted(self.capacity.items()):
            if (res == RESOURCE_GPU or res.startswith(MIG_RESOURCE_PREFIX)) and self.allocatable.get(
                res, 0
            ) < cap:
                return GPUProblem(
                    NodeProblem.ALLOCATABLE_DROPPED, f"{res} {self.allocatable.get(res, 0)}/{cap}"
                )
        return None


@dataclass(frozen=True)
class GPUProblem:
    """A node's GPU problem: the typed kind and a detail for people (`str` gives both)."""

    kind: NodeProblem
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.detail}".strip()


@dataclass(frozen=True)
class Terminated:
    exit_code: int
    reason: str  # the kubelet's reason (Completed, Error, ...)
    message: str
    finished_at: float | None

    def termination(self) -> TerminationMessage | None:
        return TerminationMessage.parse(self.message) if self.message else None

    def trtforge_reason(self) -> str | None:
        """Our reason (GPUFault, EngineLoadFailed, ...) from the message, else from the exit code."""
        msg = self.termination()
        if msg is not None:
            return msg.reason
        r = REASON_BY_EXIT_CODE.get(self.exit_code)
        return str(r) if r is not None else None


def _terminated(state: Mapping[str, Any] | None) -> Terminated | None:
    t = (state or {}).get("terminated")
    if not t:
        return None
    return Terminated(
        exit_code=int(t.get("exitCode", 0)),
        reason=str(t.get("reason") or ""),
        message=str(t.get("message") or ""),
        finished_at=parse_time(t.get("finishedAt")),
    )


@dataclass(frozen=True)
class ContainerView:
    name: str
    ready: bool
    restart_count: int
    terminated: Terminated | None  # the current state
    last_terminated: Terminated | None  # the previous run (after a restart)
    waiting: Waiting | None = None  # the current state, while the container has not started


@dataclass(frozen=True)
class Waiting:
    reason: str  # the kubelet's reason (ContainerCreating, CreateContainerConfigError, ErrImagePull, ...)
    message: str


# Waiting reasons that say the container cannot start as things are (not that it is on its way).
CANNOT_START = frozenset(
    {
        "CreateContainerConfigError",
        "CreateContainerError",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RunContainerError",
    }
)


def _waiting(state: Mapping[str, Any] | None) -> Waiting | None:
    w = (state or {}).get("waiting")
    if not w:
        return None
    return Waiting(reason=str(w.get("reason") or ""), message=str(w.get("message") or ""))


@dataclass(frozen=True)
class PodView:
    name: str
    namespace: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    node: str | None
    phase: str
    ready: bool
    containers: tuple[ContainerView, ...] = ()
    deleting: bool = False
    created: float | None = None
    unschedulable: str | None = None  # the scheduler's message while it cannot place the pod
    # What a finished build or verify pod reported (its termination message, parsed once): the
    # builder's result or why it failed. None for other pods and for pods that have not finished.
    reported: Reported | None = None
    controller: tuple[str, str] = ("", "")  # (kind, uid) of its controller ownerReference
    spec_fingerprint: str = ""  # what it runs (pod_spec.fingerprint)
    ip: str | None = None  # status.podIP, once it has one

    @classmethod
    def from_build_pod(cls, obj: Mapping[str, Any]) -> PodView:
        """A build pod, with the result its termination message reports."""
        pod = cls.from_k8s(obj)
        return _replace_pod(pod, build_pod_result(pod))

    @classmethod
    def from_verify_pod(cls, obj: Mapping[str, Any]) -> PodView:
        """A verify pod, with the failure its termination message reports (a success reports none)."""
        pod = cls.from_k8s(obj)
        return _replace_pod(pod, verify_pod_failure(pod))

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> PodView:
        meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
        conds = status.get("conditions") or []
        containers = tuple(
            ContainerView(
                name=str(cs.get("name", "")),
                ready=bool(cs.get("ready")),
                restart_count=int(cs.get("restartCount") or 0),
                terminated=_terminated(cs.get("state")),
                last_terminated=_terminated(cs.get("lastState")),
                waiting=_waiting(cs.get("state")),
            )
            for cs in status.get("containerStatuses") or []
        )
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            uid=meta.get("uid", ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            node=spec.get("nodeName"),
            phase=str(status.get("phase") or "Pending"),
            ready=_ready(conds),
            containers=containers,
            deleting=bool(meta.get("deletionTimestamp")),
            created=parse_time(meta.get("creationTimestamp")),
            unschedulable=next(
                (
                    str(c.get("message") or c.get("reason") or "unschedulable")
                    for c in conds
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"
                ),
                None,
            ),
            controller=_controller(meta),
            spec_fingerprint=pod_spec.fingerprint(spec),
            ip=status.get("podIP") or None,
        )

    def cannot_start(self) -> Waiting | None:
        """The first container's reason for not starting, when it is one that will not pass by itself."""
        for c in self.containers:
            if c.waiting is not None and c.waiting.reason in CANNOT_START:
                return c.waiting
        return None

    def terminations(self) -> list[Terminated]:
        out: list[Terminated] = []
        for c in self.containers:
            out.extend(t for t in (c.terminated, c.last_terminated) if t is not None)
        return out


def _controller(meta: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, uid) of an object's controller ownerReference; ("", "") without one."""
    for o in meta.get("ownerReferences") or []:
        if o.get("controller"):
            return str(o.get("kind") or ""), str(o.get("uid") or "")
    return "", ""


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line, cut to `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _exit_failure(t: Terminated) -> BuildFailure:
    """A failure from a container that left no message of ours: its last line, or the kubelet's reason."""
    tail = t.message.strip().splitlines()[-1] if t.message.strip() else t.reason
    return BuildFailure(
        error=one_line(tail or f"exit code {t.exit_code}"), reason="Error", exit_code=t.exit_code
    )


def build_pod_result(pod: PodView) -> Reported | None:
    """What a finished build pod reported: the builder's typed termination message, or, for a
    container that failed without one, a failure made from its exit."""
    for c in pod.containers:
        t = c.terminated
        if t is None:
            continue
        parsed: Reported | None = llm_result(t.message) or parse_build_message(t.message)
        if parsed is not None:
            return parsed
        if t.exit_code != 0:
            return _exit_failure(t)
    return None


def verify_pod_failure(pod: PodView) -> BuildFailure | None:
    """Why a verify pod failed (a container that exited non-zero), else None."""
    out: BuildFailure | None = None
    for c in pod.containers:
        t = c.terminated
        if t is None or t.exit_code == 0:
            continue
        parsed = parse_build_message(t.message)
        out = parsed if isinstance(parsed, BuildFailure) else _exit_failure(t)
    return out


def _replace_pod(pod: PodView, reported: Reported | None) -> PodView:
    if reported is None:
        return pod
    return PodView(**{**pod.__dict__, "reported": reported})


@dataclass(frozen=True)
class JobView:
    name: str
    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    active: int = 0
    succeeded: int = 0
    failed: int = 0
    complete: bool = False
    failed_final: bool = False
    failure_reason: str = ""
    failure_message: str = ""
    created: float | None = None
    started: float | None = None
    finished: float | None = None
    deleting: bool = False
    # What its pod reported, while the Job does not carry it yet (observe/engine.py fills it in; the
    # engine pass then records it on the Job: planning/engine.py, RecordResult).
    reported: Reported | None = None

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> JobView:
        meta, status = _meta(obj), obj.get("status") or {}
        complete = failed_final = False
        reason = message = ""
        finished = parse_time(status.get("completionTime"))
        for c in status.get("conditions") or []:
            if c.get("status") != "True":
                continue
            if c.get("type") == "Complete":
                complete = True
            elif c.get("type") == "Failed":
                failed_final = True
                reason, message = str(c.get("reason") or ""), str(c.get("message") or "")
                finished = finished or parse_time(c.get("lastTransitionTime"))
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            active=int(status.get("active") or 0),
            succeeded=int(status.get("succeeded") or 0),
            failed=int(status.get("failed") or 0),
            complete=complete,
            failed_final=failed_final,
            failure_reason=reason,
            failure_message=message,
            created=parse_time(meta.get("creationTimestamp")),
            started=parse_time(status.get("startTime")),
            finished=finished,
            deleting=bool(meta.get("deletionTimestamp")),
        )

    @property
    def done(self) -> bool:
        return self.complete or self.failed_final

    def built_key(self) -> str | None:
        """The engine key the builder's result names, when the Job completed with one."""
        r = self.result()
        if not self.complete or not r or "error" in r:
            return None
        try:
            return BuildResult.model_validate(r).key
        except ValueError:
            return None

    @property
    def running(self) -> bool:
        return not self.done and not self.deleting

    @property
    def build_id(self) -> str:
        return self.labels.get(LABEL_BUILD_ID, "")

    @property
    def request_digest(self) -> str:
        """The request key the Job was created for (docs/design.md §"Engine keys")."""
        return self.annotations.get(ANNOTATION_REQUEST_DIGEST, "")

    @property
    def kind(self) -> str:
        return self.labels.get(LABEL_BUILD_KIND, "build")

    @property
    def attempt(self) -> int:
        return _qty_int(self.annotations.get(ANNOTATION_ATTEMPT, "1")) or 1

    @property
    def engine_key(self) -> str:
        return self.annotations.get(ANNOTATION_ENGINE_KEY, "")

    @property
    def fault_rebuild(self) -> bool:
        """A rebuild the operator started for a GPU fault it observed (not one a tenant asked for)."""
        return self.kind == "rebuild" and self.annotations.get(ANNOTATION_REBUILD_CAUSE, "fault") == "fault"

    @property
    def created_for(self) -> str:
        return self.annotations.get(ANNOTATION_CREATED_FOR, "")

    def requesters(self) -> list[str]:
        """The TRTEngines (`namespace/name`) that use this Job, one annotation each."""
        return sorted(v for k, v in self.annotations.items() if k.startswith(REQUESTER_PREFIX))

    @property
    def recorded(self) -> bool:
        """Whether the Job carries its pod's result (the annotation)."""
        return bool(self.annotations.get(ANNOTATION_RESULT))

    def result(self) -> dict[str, Any] | None:
        """The builder's result JSON: as recorded on the Job, else as its pod reported it."""
        raw = self.annotations.get(ANNOTATION_RESULT)
        if not raw and self.reported is not None:
            raw = self.reported.to_line()
        if not raw:
            return None
        try:
            v = json.loads(raw)
        except ValueError:
            return None
        return v if isinstance(v, dict) else None


@dataclass(frozen=True)
class DeploymentView:
    name: str
    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    template_annotations: Mapping[str, str]
    generation: int = 0
    observed_generation: int = 0
    spec_replicas: int = 0
    replicas: int = 0
    ready_replicas: int = 0
    updated_replicas: int = 0
    available_replicas: int = 0
    progress_deadline_exceeded: bool = False
    uid: str = ""
    controller: tuple[str, str] = ("", "")  # (kind, uid) of its controller ownerReference

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> DeploymentView:
        meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
        tmeta = ((spec.get("template") or {}).get("metadata")) or {}
        stalled = any(
            c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
            for c in status.get("conditions") or []
        )
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            template_annotations=dict(tmeta.get("annotations") or {}),
            generation=int(meta.get("generation") or 0),
            observed_generation=int(status.get("observedGeneration") or 0),
            spec_replicas=int(spec["replicas"]) if spec.get("replicas") is not None else 1,
            replicas=int(status.get("replicas") or 0),
            ready_replicas=int(status.get("readyReplicas") or 0),
            updated_replicas=int(status.get("updatedReplicas") or 0),
            available_replicas=int(status.get("availableReplicas") or 0),
            progress_deadline_exceeded=stalled,
            uid=str(meta.get("uid") or ""),
            controller=_controller(meta),
        )

    def rolled_out(self) -> bool:
        """The controller saw the latest spec and every pod runs it and is ready (no old pods left)."""
        want = self.spec_replicas
        return (
            self.observed_generation >= self.generation
            and self.updated_replicas >= want
            and self.replicas == want
            and self.ready_replicas >= want
        )


@dataclass(frozen=True)
class AutoscalerView:
    """An autoscaler with the operator's labels: a HorizontalPodAutoscaler (read in any served
    version: only its metadata, target and counts are used) or a KEDA ScaledObject. ``owner_kind``
    tells the operator's own (owned by an InferenceDeployment) from an HPA that KEDA made for a
    ScaledObject, which carries the ScaledObject's labels but is KEDA's."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    target_name: str = ""  # spec.scaleTargetRef.name
    current_replicas: int = 0
    desired_replicas: int = 0
    kind: str = "HorizontalPodAutoscaler"  # or ScaledObject
    owner_kind: str = ""  # the kind of its controller ownerReference ("" without one)

    @classmethod
    def from_k8s(cls, obj: Mapping[str, Any]) -> AutoscalerView:
        meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
        owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
        return cls(
            name=meta.get("name", ""),
            namespace=meta.get("namespace", ""),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            target_name=str((spec.get("scaleTargetRef") or {}).get("name") or ""),
            current_replicas=int(status.get("currentReplicas") or 0),
            desired_replicas=int(status.get("desiredReplicas") or 0),
            kind=str(obj.get("kind") or "HorizontalPodAutoscaler"),
            owner_kind=str(owners[0].get("kind") or "") if owners else "",
        )


# ------------------------------------------------------------------------------ one TRTEngine pass


@dataclass(frozen=True)
class ObservedFaults:
    """What one InferenceDeployment's status records (the operator's writing), by the engine it serves."""

    requester: str  # the InferenceDeployment, `namespace/name`
    records: tuple[FaultRecord, ...]


@dataclass(frozen=True)
class RequesterView:
    """What one TRTEngine that requested build Jobs holds: its status's targets, whether that status
    is of its current generation, its annotations and the faults its InferenceDeployments recorded."""

    targets: Sequence[TargetStatus]
    current: bool
    annotations: Mapping[str, str] = field(default_factory=dict)
    observed_faults: Sequence[ObservedFaults] = ()


@dataclass(frozen=True)
class Capacity:
    """Build Jobs running now, cluster-wide and requested from this namespace, and the limits."""

    running_total: int
    running_in_namespace: int
    max_total: int
    max_per_namespace: int

    def allows(self, extra_total: int, extra_ns: int) -> bool:
        return (
            self.running_total + extra_total < self.max_total
            and self.running_in_namespace + extra_ns < self.max_per_namespace
        )


@dataclass(frozen=True)
class UnreadableEngine:
    """A TRTEngine whose spec the models refuse (the CRD of an old cluster lets it in)."""

    namespace: str
    name: str
    generation: int
    status: TRTEngineStatus  # what its status holds, parsed (empty when it does not parse)
    status_wire: Mapping[str, Any]  # what its status holds, as read
    error: str  # which field is wrong and why
    now: float


@dataclass(frozen=True)
class EngineObserved:
    """Everything one TRTEngine pass plans from, gathered once (observe/engine.py): data only."""

    namespace: str
    name: str
    generation: int
    spec: TRTEngineSpec
    status: TRTEngineStatus
    nodes: Sequence[NodeView]
    # This engine's build Jobs of the build namespace, by build id (the ids its targets' request
    # keys and engine keys name; a list in unit tests). Each with what its pod reported.
    jobs: Sequence[JobView] | Mapping[str, Sequence[JobView]]
    capacity: Capacity
    now: float
    # The store, read once per pass: manifests by engine key, the request index by request key
    # (docs/design.md §"Engine keys"). A key missing here has no manifest or record.
    manifests: Mapping[str, Manifest] = field(default_factory=dict)
    requests: Mapping[str, RequestRecord] = field(default_factory=dict)
    unschedulable: Mapping[str, str] = field(default_factory=dict)  # build Job -> why its pod waits
    uid: str = ""
    # Proof of possession (docs/security.md): the broker's record for this namespace and the current
    # source (None: not proven yet), the verify Jobs of this namespace, and why finished ones failed.
    possession: PossessionRecord | None = None
    verify_jobs: Sequence[JobView] = ()
    verify_failures: Mapping[str, BuildFailure] = field(default_factory=dict)  # failed verify Job -> why
    # Running verify Job -> why its pod cannot start (the kubelet's or scheduler's reason and message).
    verify_stuck: Mapping[str, str] = field(default_factory=dict)
    cache_scope: str = ""  # the namespace's cache scope (CacheSettings.scope)
    # Rebuilds (planning/rebuild.py): the faults this namespace's InferenceDeployments that serve this
    # engine recorded in their status, and the engine's own annotations (where a tenant may ask for a
    # rebuild of one of its targets). This planner creates the Jobs, the one owner of build Jobs.
    observed_faults: Sequence[ObservedFaults] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    status_wire: Mapping[str, Any] = field(default_factory=dict)  # the status as read (patch base)
    # An LLM engine's checkpoint manifest in the store, when committed (observe/llm_keys.py's key).
    checkpoint: ArtefactManifest | None = None

    @cached_property  # hashed once per pass, not once per target and call
    def source_fingerprint(self) -> str:
        m = self.spec.source
        return source_fingerprint(m.uri, m.secret_ref.name if m.secret_ref else None, m.sha256)

    @cached_property
    def verified_sha256(self) -> str | None:
        """The model digest this namespace proved it holds through the current source, else None."""
        p = self.possession
        pin = self.spec.source.sha256 or None
        if p is None or not p.proves(self.namespace, self.source_fingerprint, pin):
            return None
        return p.sha256

    @property
    def requester(self) -> str:
        """`namespace/name`, as this engine names itself on the Jobs it uses."""
        return f"{self.namespace}/{self.name}"


def jobs_by_build_id(jobs: Sequence[JobView] | Mapping[str, Sequence[JobView]]) -> dict[str, list[JobView]]:
    """The live (not deleting) Jobs per build id."""
    found = [j for js in jobs.values() for j in js] if isinstance(jobs, Mapping) else list(jobs)
    out: dict[str, list[JobView]] = {}
    for j in found:
        if not j.deleting:
            out.setdefault(j.build_id, []).append(j)
    return out


def obs_requester(obs: EngineObserved) -> str:
    return obs.requester


def request_builds(jobs_by_id: Mapping[str, list[JobView]], request_key: str) -> list[JobView]:
    """The build Jobs (first builds and retries, not rebuilds) of a request key, by attempt."""
    return sorted(
        (j for j in jobs_by_id.get(request_key[:20], []) if j.kind == "build"), key=lambda j: j.attempt
    )


def built_key(builds: list[JobView]) -> str | None:
    """The engine key the latest successful build of a request reported, if any."""
    return next((k for j in reversed(builds) if (k := j.built_key())), None)


# ------------------------------------------------------------------------ one InferenceDeployment pass


class HpaApi(enum.StrEnum):
    """The HorizontalPodAutoscaler API versions that can scale on a custom (Pods) metric."""

    V2 = "autoscaling/v2"
    V2BETA2 = "autoscaling/v2beta2"


@dataclass(frozen=True)
class AutoscalingApis:
    """What the apiserver serves for the operator's autoscalers (discovery)."""

    hpa: HpaApi | None = None
    keda: bool = False


@dataclass(frozen=True)
class UnreadableDeployment:
    """An InferenceDeployment whose spec the models refuse (the CRD of an old cluster lets it in)."""

    namespace: str
    name: str
    generation: int
    status: InferenceDeploymentStatus  # what its status holds, parsed (empty when it does not parse)
    status_wire: Mapping[str, Any]  # what its status holds, as read
    error: str  # which field is wrong and why
    now: float


@dataclass(frozen=True)
class DeploymentObserved:
    """Everything one InferenceDeployment pass plans from, gathered once (observe/deployment.py)."""

    namespace: str
    name: str
    uid: str
    generation: int
    spec: InferenceDeploymentSpec
    status: InferenceDeploymentStatus
    engine: TRTEngine | None  # the referenced TRTEngine (same namespace), None when absent or invalid
    deployments: Sequence[DeploymentView]  # ours (label trtforge.io/inferencedeployment)
    pods: Sequence[PodView]  # our runtime pods
    nodes: Sequence[NodeView]
    jobs: Sequence[JobView]  # build Jobs (for rebuilds of our keys)
    now: float
    engine_problem: str | None = None  # why `engine` is None
    # HPAs and ScaledObjects with our label (trtforge.io/inferencedeployment); only those an
    # InferenceDeployment owns are the operator's (KEDA's own HPA carries its ScaledObject's labels)
    autoscalers: Sequence[AutoscalerView] = ()
    # what the apiserver serves for autoscalers (discovery)
    apis: AutoscalingApis = field(default_factory=AutoscalingApis)
    status_wire: Mapping[str, Any] = field(default_factory=dict)  # the status as read (patch base)
    # ReplicaSet uid -> (its controlling Deployment's uid, its template's pod_spec.fingerprint); read
    # only when a pod reports a fault
    replica_sets: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)  # the InferenceDeployment's own
    # Group backend lws only (docs/llm.md §"Groups"): whether the apiserver serves LeaderWorkerSets
    # (None: not asked), and the live ones labelled as this InferenceDeployment's, by name.
    lws_served: bool | None = None
    leader_worker_sets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class DeploymentChildren:
    """A deleted InferenceDeployment's children: its runtime Deployments and autoscalers."""

    name: str
    deployments: Sequence[str]
    autoscalers: Sequence[AutoscalerView]


# ------------------------------------------------------------------------------- one engine GC pass


@dataclass(frozen=True)
class StoredEngine:
    key: str
    created_at: float  # the manifest's created_at


@dataclass(frozen=True)
class StoredProof:
    """A possession record in the store: ``possession/<namespace>/<fingerprint>.json``."""

    namespace: str
    fingerprint: str
    sha256: str
    verified_at: float


@dataclass(frozen=True)
class StoredGrant:
    """The operator's record of a verify Job: ``verify-grants/<namespace>/<job>.json``."""

    namespace: str
    job: str
    expires_at: float


def unrecorded_requests(engine_statuses: Iterable[Mapping[str, object]]) -> set[str]:
    """The request keys of targets that record no engine key yet (built, perhaps, but not recorded):
    the ones to look up in the store's request index for :func:`referenced_keys`."""
    out: set[str] = set()
    for st in engine_statuses:
        for t in st.get("targets") or []:  # type: ignore[attr-defined]
            if isinstance(t, Mapping) and not t.get("engineKey") and (rk := t.get("requestKey")):
                out.add(str(rk))
    return out


@dataclass(frozen=True)
class StoreGCObserved:
    """What one GC pass plans from (observe/gc.py): the store, listed first, then what in the cluster
    references it."""

    stored: Sequence[StoredEngine]  # the store's engines, listed before the references were read
    listed_at: float  # when the TRTEngines were listed
    engine_statuses: Sequence[Mapping[str, Any]]  # every TRTEngine's status, as read
    engine_sources: frozenset[tuple[str, str]]  # (namespace, source fingerprint) of every TRTEngine
    template_keys: Sequence[str]  # the engine key of every runtime Deployment's pod template
    jobs: Sequence[JobView]  # the build namespace's Jobs
    filed: Mapping[str, str | None]  # a live Job's request key -> the engine the request index names
    recorded_filed: Mapping[str, str]  # a status's unrecorded request key -> the engine filed for it
    build_models: frozenset[str]  # models a build Job that is not done reads
    models: Sequence[str]  # staged model digests
    proofs: Sequence[StoredProof]
    grants: Sequence[StoredGrant]
    namespaces: frozenset[str] | None = None  # the watched namespaces (None: all)
