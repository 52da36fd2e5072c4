"""``InferenceDeployment`` (trtforge.io/v1alpha1): serve a TRTEngine of the same namespace.

Wire names are camelCase, Python names snake_case. Parse with ``InferenceDeployment.model_validate(body)``.

Helpers the operator uses:

- :meth:`InferenceDeploymentSpec.replicas_by_target` -> ``dict[GPUTarget, int]``: given the engine's
  targets, the replicas wanted per target (``spec.targets`` selects a subset and may override
  ``spec.replicas`` per target; without it every engine target gets ``spec.replicas``).
- :class:`InferenceDeploymentStatus`, :class:`DeploymentTargetStatus`, :class:`FaultRecord`
  (:data:`MAX_FAULTS` most recent kept; :meth:`InferenceDeploymentStatus.add_fault` trims).
- Condition types :data:`READY`, :data:`PROGRESSING`, :data:`DEGRADED`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, WithJsonSchema, model_validator

from trtforge.contract.gpu import GPUTarget
from trtforge.contract.quantity import QUANTITY_PATTERN, parse_quantity
from trtforge_operator.api.common import (
    API_VERSION,
    ApiModel,
    Condition,
    LocalObjectReference,
    ObjectMeta,
    Time,
)
from trtforge_operator.api.trtengine import GPU_PRODUCT_PATTERN, MAX_TARGETS, MIG_PROFILE_PATTERN

MAX_FAULTS = 20
INT_OR_PERCENT_PATTERN = r"^[0-9]+%?$"

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
CONDITION_TYPES = (READY, PROGRESSING, DEGRADED)


def _check_quantity(v: int | str) -> int | str:
    parse_quantity(v)
    return v


Quantity = Annotated[
    int | str,
    AfterValidator(_check_quantity),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A Kubernetes quantity: ``500m``, ``2Gi``, ``1``."""


def _check_int_or_percent(v: int | str) -> int | str:
    if isinstance(v, int):
        if v < 0:
            raise ValueError(f"{v} must not be negative")
    elif not v.endswith("%") or not v[:-1].isdigit():
        raise ValueError(f"{v!r} must be a non-negative integer or a percentage like '25%'")
    return v


IntOrPercent = Annotated[
    int | str,
    AfterValidator(_check_int_or_percent),
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": INT_OR_PERCENT_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]
"""A count or a percentage (``1`` or ``"25%"``), as in a Deployment's rolling update."""


# ---------------------------------------------------------------------------------------------- spec


class EngineReference(LocalObjectReference):
    """A TRTEngine in the same namespace."""


class DeploymentTarget(ApiModel):
    """One engine target to serve, optionally with its own replica count."""

    gpu: str = Field(
        min_length=1,
        max_length=63,
        pattern=GPU_PRODUCT_PATTERN,
        description="nvidia.com/gpu.product value (or cpu) of an engine target.",
    )
    mig: str | None = Field(
        default=None,
        max_length=32,
        pattern=MIG_PROFILE_PATTERN,
        description="MIG profile of that engine target; unset for the full GPU.",
    )
    replicas: int | None = Field(
        default=None, ge=0, le=1000, description="Replicas on this target; unset: spec.replicas."
    )

    def to_contract(self) -> GPUTarget:
        return GPUTarget(gpu=self.gpu, mig=self.mig)


class ResourceRequirements(ApiModel):
    """Compute resources of a runtime container, as in a Pod (the GPU is added by the operator)."""

    limits: dict[Annotated[str, Field(max_length=253)], Quantity] = Field(
        default_factory=dict, description="Maximum resources, e.g. cpu: 4, memory: 16Gi."
    )
    requests: dict[Annotated[str, Field(max_length=253)], Quantity] = Field(
        default_factory=dict, description="Guaranteed resources."
    )


class EnvVar(ApiModel):
    """An environment variable of the runtime container, as in a Pod."""

    name: str = Field(min_length=1, max_length=256, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: dict[str, Any] | None = Field(
        default=None,
        description="A source for the value (secretKeyRef, configMapKeyRef, fieldRef, ...).",
        json_schema_extra={"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    )


class Toleration(ApiModel):
    """A Pod toleration, e.g. for tainted GPU nodes."""

    key: str | None = Field(default=None, max_length=317, description="Taint key; unset matches all.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: str | None = Field(default=None, max_length=63, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; unset matches all."
    )
    toleration_seconds: int | None = Field(default=None, description="For NoExecute: how long to stay.")


class Batching(ApiModel):
    """Dynamic batching of requests in the runtime."""

    max_batch_size: int = Field(
        default=1, ge=1, le=4096, description="Largest batch formed; 1 turns batching off."
    )
    max_queue_delay_microseconds: int = Field(
        default=0, ge=0, le=10_000_000, description="Longest a request waits for a batch to fill."
    )


class RuntimeSettings(ApiModel):
    """The runtime pods."""

    image: str | None = Field(
        default=None, max_length=1024, description="Runtime image; unset: the operator's configured image."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="Always, IfNotPresent or Never."
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements, description="CPU and memory of the runtime container."
    )
    env: list[EnvVar] = Field(default_factory=list, max_length=64, description="Extra environment variables.")
    port: int = Field(
        default=8000, ge=1, le=65535, description="HTTP port of the inference protocol (KServe v2)."
    )
    grpc_port: int = Field(
        default=8001,
        ge=1,
        le=65535,
        description="gRPC port of the inference protocol (KServe v2, inference.GRPCInferenceService).",
    )
    batching: Batching = Field(
        default_factory=Batching, description="Dynamic batching.", json_schema_extra={"default": {}}
    )
    instances: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="Engine execution contexts per worker (concurrent batches); unset: the runtime's "
        "default (one per CPU for ONNX Runtime, 1 for TensorRT).",
    )
    workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Runtime processes per pod on the same ports, each on its share of the CPUs; unset: "
        "one per 4 CPUs the pod may use (its CPU limit, else its node's CPUs).",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations added to the runtime pods."
    )


class Rollout(ApiModel):
    """How a new engine replaces the old one: new pods Ready before old ones go."""

    max_surge: IntOrPercent = Field(default="25%", description="Extra pods during a rollout.")
    max_unavailable: IntOrPercent = Field(default=0, description="Pods that may be missing during a rollout.")
    progress_deadline_seconds: int = Field(
        default=600,
        ge=30,
        le=86400,
        description="After this long without progress the rollout is reported Degraded.",
    )


class FaultPolicy(ApiModel):
    """What to do on a GPU fault."""

    rebuild_on_gpu_fault: bool = Field(
        default=True, alias="rebuildOnGPUFault", description="Rebuild the target's engine on a healthy node."
    )
    max_rebuilds_per_hour: int = Field(
        default=3, ge=0, le=60, description="Cap on fault-triggered rebuilds per target."
    )


_UNIQUE_TARGETS = (
    "self.all(t, self.exists_one(u, u.gpu == t.gpu && "
    "(has(u.mig) ? u.mig : '') == (has(t.mig) ? t.mig : '')))"
)


class InferenceDeploymentSpec(ApiModel):
    """Serve a TRTEngine of this namespace on its GPU targets."""

    engine_ref: EngineReference = Field(description="The TRTEngine (same namespace) to serve.")
    replicas: int = Field(default=1, ge=0, le=1000, description="Replicas per target.")
    targets: list[DeploymentTarget] = Field(
        default_factory=list,
        max_length=MAX_TARGETS,
        description="Serve only these engine targets (with optional per-target replicas); empty: all.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": _UNIQUE_TARGETS, "message": "targets must be unique (gpu, mig) pairs"},
            ]
        },
    )
    runtime: RuntimeSettings = Field(
        default_factory=RuntimeSettings,
        description="Runtime pods.",
        json_schema_extra={
            "default": {},
            "x-kubernetes-validations": [
                {
                    "rule": "self.grpcPort != self.port",
                    "message": "runtime.grpcPort must differ from runtime.port",
                },
            ],
        },
    )
    rollout: Rollout = Field(
        default_factory=Rollout, description="Progressive rollout.", json_schema_extra={"default": {}}
    )
    fault_policy: FaultPolicy = Field(
        default_factory=FaultPolicy, description="GPU fault handling.", json_schema_extra={"default": {}}
    )

    @model_validator(mode="after")
    def _unique(self) -> InferenceDeploymentSpec:
        if self.runtime.grpc_port == self.runtime.port:
            raise ValueError(f"runtime.grpcPort must differ from runtime.port ({self.runtime.port})")
        seen = set()
        for t in self.targets:
            if (t.gpu, t.mig) in seen:
                raise ValueError(f"targets must be unique (gpu, mig) pairs; {t.gpu}/{t.mig} repeats")
            seen.add((t.gpu, t.mig))
        return self

    def replicas_by_target(self, engine_targets: Iterable[GPUTarget]) -> dict[GPUTarget, int]:
        """Replicas wanted per engine target, in the engine's order (subset and overrides applied)."""
        engine = list(dict.fromkeys(engine_targets))
        if not self.targets:
            return {t: self.replicas for t in engine}
        wanted = {
            t.to_contract(): (self.replicas if t.replicas is None else t.replicas) for t in self.targets
        }
        return {t: wanted[t] for t in engine if t in wanted}


# -------------------------------------------------------------------------------------------- status


class DeploymentTargetStatus(ApiModel):
    """Serving state on one GPU target."""

    name: str = Field(max_length=63, description="Target name (GPUTarget.name).")
    gpu: str | None = Field(default=None, max_length=63, description="nvidia.com/gpu.product value or cpu.")
    mig: str | None = Field(default=None, max_length=32, description="MIG profile, unset for the full GPU.")
    engine_key: str | None = Field(default=None, max_length=64, description="Engine key being served.")
    deployment_name: str | None = Field(default=None, max_length=253, description="The Deployment.")
    replicas: int = Field(default=0, ge=0, description="Pods wanted.")
    ready_replicas: int = Field(default=0, ge=0, description="Pods Ready.")
    updated_replicas: int = Field(default=0, ge=0, description="Pods on the current engine.")
    message: str | None = Field(default=None, max_length=4096, description="One line on this target.")


class NodeProblem(StrEnum):
    """Why a node's GPUs cannot be trusted (a node-level fault's typed cause)."""

    NOT_READY = "NodeNotReady"
    GPU_HEALTH_TAINT = "GPUHealthTaint"
    NODE_CONDITION = "NodeCondition"
    ALLOCATABLE_DROPPED = "AllocatableDropped"


class FaultRecord(ApiModel):
    """A GPU fault the operator handled."""

    time: Time = Field(description="When the fault was seen.")
    pod: str | None = Field(default=None, max_length=253, description="Affected pod.")
    node: str | None = Field(default=None, max_length=253, description="Node of the faulty GPU.")
    gpu: str | None = Field(default=None, max_length=128, description="GPU (UUID or index) when known.")
    target: str | None = Field(default=None, max_length=63, description="Target name.")
    xid: int | None = Field(default=None, ge=0, description="NVIDIA Xid code, when the fault is one.")
    reason: str | None = Field(default=None, max_length=1024, description="Error, when not an Xid.")
    node_problem: NodeProblem | None = Field(
        default=None, description="Why the node was suspect, when the fault was seen on the node."
    )
    action: str = Field(max_length=256, description="What the operator did, e.g. PodMoved, Rebuilt.")
    recovered_seconds: float | None = Field(
        default=None, ge=0, description="Seconds until the target was Ready again."
    )


class InferenceDeploymentStatus(ApiModel):
    """Observed state, written only by the operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Ready, Progressing, Degraded.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    targets: list[DeploymentTargetStatus] = Field(
        default_factory=list,
        max_length=MAX_TARGETS,
        description="One entry per served target.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    replicas: int | None = Field(default=None, ge=0, description="Pods wanted, all targets.")
    ready_replicas: int | None = Field(default=None, ge=0, description="Pods Ready, all targets.")
    ready: str | None = Field(
        default=None, max_length=32, description='Ready pods out of wanted, like "2/3".'
    )
    endpoint: str | None = Field(
        default=None, max_length=1024, description="In-cluster URL of the Service (KServe v2 protocol)."
    )
    faults: list[FaultRecord] = Field(
        default_factory=list,
        max_length=MAX_FAULTS,
        description=f"The last {MAX_FAULTS} GPU faults, oldest first.",
    )

    def add_fault(self, fault: FaultRecord) -> None:
        """Append a fault, keeping the last :data:`MAX_FAULTS`."""
        self.faults = [*self.faults, fault][-MAX_FAULTS:]


# ------------------------------------------------------------------------------------------ resource


class InferenceDeployment(ApiModel):
    """Serves a TRTEngine on its GPU targets, moving pods and rebuilding on GPU faults."""

    KIND: ClassVar[str] = "InferenceDeployment"
    PLURAL: ClassVar[str] = "inferencedeployments"
    SINGULAR: ClassVar[str] = "inferencedeployment"
    SHORT_NAMES: ClassVar[list[str]] = ["infd"]
    PRINTER_COLUMNS: ClassVar[list[dict[str, Any]]] = [
        {"name": "Engine", "type": "string", "jsonPath": ".spec.engineRef.name"},
        {
            "name": "Ready",
            "type": "string",
            "jsonPath": ".status.ready",
            "description": "Ready pods out of wanted",
        },
        {
            "name": "Status",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            "description": "Reason of the Ready condition",
        },
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]

    api_version: Literal["trtforge.io/v1alpha1"] = API_VERSION
    kind: Literal["InferenceDeployment"] = "InferenceDeployment"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: InferenceDeploymentSpec
    status: InferenceDeploymentStatus = Field(default_factory=InferenceDeploymentStatus)
