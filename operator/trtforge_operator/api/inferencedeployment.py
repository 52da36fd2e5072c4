"""``InferenceDeployment`` (trtforge.io/v1alpha1): serve a TRTEngine of the same namespace.

Wire names are camelCase, Python names snake_case. Parse with ``InferenceDeployment.model_validate(body)``.

Helpers the operator uses:

- :meth:`InferenceDeploymentSpec.replicas_by_target` -> ``dict[GPUTarget, int]``: given the engine's
  targets, the replicas wanted per target: ``spec.replicas`` in all, split by :func:`split_replicas`
  over the served targets in proportion to their shares (``spec.targets[].replicas``, 1 where unset).
- :meth:`InferenceDeploymentSpec.autoscaling_by_target`: the autoscaling settings of each target (its
  own, else ``spec.autoscaling``), None where the operator keeps a fixed count.
- :class:`InferenceDeploymentStatus`, :class:`DeploymentTargetStatus`, :class:`FaultRecord`
  (:data:`MAX_FAULTS` most recent kept; :meth:`InferenceDeploymentStatus.add_fault` trims).
- Condition types :data:`READY`, :data:`PROGRESSING`, :data:`DEGRADED`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

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
from trtforge_operator.api.trtengine import MAX_TARGETS, GPUSelection

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


def split_replicas(total: int, shares: dict[GPUTarget, int]) -> dict[GPUTarget, int]:
    """``total`` replicas over the targets in proportion to their ``shares`` (largest remainder).

    Each target first gets ``floor(total * share / sum(shares))``; the replicas left over go one each
    to the targets with the largest remainders, ties to the earlier target (the engine's order).
    Shares summing to ``total`` give each target exactly its share; a share of 0 gets nothing; all
    shares 0 give every target 0. The counts always sum to ``total`` (or to 0 without a share).
    """
    weight = sum(shares.values())
    if weight <= 0 or total <= 0:
        return dict.fromkeys(shares, 0)
    out = {t: total * s // weight for t, s in shares.items()}
    left = total - sum(out.values())
    order = sorted(enumerate(shares.items()), key=lambda x: (-(total * x[1][1] % weight), x[0]))
    for _, (t, _s) in order[:left]:
        out[t] += 1
    return out


SCALE_TO_ZERO_MESSAGE = (
    "minReplicas must be at least 1: scaling to zero needs a way to hold the first request while a "
    "pod starts, which trtforge does not have; scale to zero is not supported"
)


class AutoscalingMetric(StrEnum):
    """The runtime's load signal an autoscaler follows, averaged over a target's pods."""

    REQUESTS_IN_FLIGHT = "RequestsInFlight"
    QUEUE_DEPTH = "QueueDepth"
    REQUEST_RATE = "RequestRate"
    KV_CACHE_UTILIZATION = "KVCacheUtilization"  # LLM servers that export it (trtllm-serve)


CUSTOM_METRIC_NAMES: dict[AutoscalingMetric, str] = {
    AutoscalingMetric.REQUESTS_IN_FLIGHT: "trtforge_runtime_requests_in_flight",
    AutoscalingMetric.QUEUE_DEPTH: "trtforge_runtime_queue_depth",
    AutoscalingMetric.REQUEST_RATE: "trtforge_runtime_requests_per_second",
    AutoscalingMetric.KV_CACHE_UTILIZATION: "trtforge_llm_kv_cache_utilization",
}
"""The name each metric has in the custom metrics API (``custom.metrics.k8s.io``, per pod): the
runtime's gauges as they are, and the per-second rate of ``trtforge_runtime_requests_total``."""


class AutoscalingProvider(StrEnum):
    """What scales a target Deployment for the operator: its own HPA, or a KEDA ScaledObject."""

    HPA = "HPA"
    KEDA = "KEDA"


class Autoscaling(ApiModel):
    """An autoscaler per target Deployment (a HorizontalPodAutoscaler or a KEDA ScaledObject), created
    and owned by the operator."""

    provider: AutoscalingProvider = Field(
        default=AutoscalingProvider.HPA,
        description="HPA: a HorizontalPodAutoscaler reading the metric from the custom metrics API "
        "(prometheus-adapter). KEDA: a KEDA ScaledObject (keda.sh/v1alpha1) with a prometheus trigger "
        "on the same metric, queried from the Prometheus the operator is configured with; needs "
        "KEDA's CRDs in the cluster (without them the InferenceDeployment's Autoscaling condition "
        "says so and no autoscaler is made).",
    )

    min_replicas: int = Field(
        default=1,
        le=1000,
        description="Fewest pods of a target. At least 1: scale to zero is not supported (it needs a "
        "way to hold the first request while a pod starts).",
        json_schema_extra={"minimum": 1},
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most pods of a target.")
    metric: AutoscalingMetric = Field(
        default=AutoscalingMetric.REQUESTS_IN_FLIGHT,
        description="The load signal, per pod: RequestsInFlight (requests accepted and not yet "
        "answered; trtforge_runtime_requests_in_flight), QueueDepth (requests waiting for an "
        "execution instance; trtforge_runtime_queue_depth) or RequestRate (requests per second; "
        "trtforge_runtime_requests_per_second) or, for an LLM whose server exports it (trtllm-serve, "
        "not llama.cpp), KVCacheUtilization (the KV cache's used fraction, 0 to 1; "
        "trtforge_llm_kv_cache_utilization), read from the custom metrics API. For an LLM, "
        "QueueDepth is the server's waiting requests.",
    )
    target_value: Quantity = Field(
        description="The metric's average per pod the autoscaler holds, e.g. 4 (in flight) or 500m.",
    )

    @field_validator("min_replicas")
    @classmethod
    def _no_scale_to_zero(cls, v: int) -> int:
        if v < 1:
            raise ValueError(SCALE_TO_ZERO_MESSAGE)
        return v

    @field_validator("target_value")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if parse_quantity(v) <= 0:
            raise ValueError(f"targetValue must be greater than 0, not {v!r}")
        return v

    @model_validator(mode="after")
    def _range(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must not be greater than maxReplicas "
                f"({self.max_replicas})"
            )
        return self


_AUTOSCALING_RULES: list[Any] = [
    {"rule": "self.minReplicas >= 1", "message": SCALE_TO_ZERO_MESSAGE},
    {
        "rule": "self.minReplicas <= self.maxReplicas",
        "message": "minReplicas must not be greater than maxReplicas",
    },
]

# ---------------------------------------------------------------------------------------------- spec


class EngineReference(LocalObjectReference):
    """A TRTEngine in the same namespace."""


class DeploymentTarget(GPUSelection):
    """One engine target to serve, optionally with its share of the replicas and its autoscaling."""

    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="This target's share of spec.replicas (a weight; unset: 1). Shares that sum to "
        "spec.replicas give each target exactly its share; 0 serves nothing here: no pods, and no "
        "autoscaler even with autoscaling (a target held at zero, e.g. dark or a canary not yet "
        "started).",
    )
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="Autoscaling of this target; unset: spec.autoscaling.",
        json_schema_extra={"x-kubernetes-validations": _AUTOSCALING_RULES},
    )


class ResourceRequirements(ApiModel):
    """Compute resources of a runtime container, as in a Pod (the GPU is added by the operator)."""

    limits: dict[Annotated[str, Field(max_length=253)], Quantity] = Field(
        default_factory=dict, description="Maximum resources, e.g. cpu: 4, memory: 16Gi."
    )
    requests: dict[Annotated[str, Field(max_length=253)], Quantity] = Field(
        default_factory=dict, description="Guaranteed resources."
    )


class KeySelector(ApiModel):
    """A key of a Secret or ConfigMap in the InferenceDeployment's namespace, as in a Pod."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret or ConfigMap.")
    key: str = Field(min_length=1, max_length=253, description="The key to read.")
    optional: bool | None = Field(default=None, description="Whether the key may be missing.")


class ObjectFieldSelector(ApiModel):
    """A field of the pod, as in a Pod (metadata.name, status.podIP, ...)."""

    field_path: str = Field(min_length=1, max_length=256, description="Path of the field.")
    api_version: str | None = Field(default=None, max_length=64, description="Schema version of the path.")


class ResourceFieldSelector(ApiModel):
    """A resource of a container (limits.cpu, requests.memory, ...), as in a Pod."""

    resource: str = Field(min_length=1, max_length=253, description="The resource, e.g. limits.memory.")
    container_name: str | None = Field(default=None, max_length=63, description="Container name.")
    divisor: Quantity | None = Field(default=None, description="Output unit, e.g. 1Mi.")


class EnvVarSource(ApiModel):
    """Where a variable's value comes from: exactly one source, as in a Pod."""

    model_config = ApiModel.model_config | ConfigDict(
        json_schema_extra={"minProperties": 1, "maxProperties": 1}
    )

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A resource of a container."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        n = sum(
            x is not None
            for x in (self.secret_key_ref, self.config_map_key_ref, self.field_ref, self.resource_field_ref)
        )
        if n != 1:
            raise ValueError(
                "valueFrom takes exactly one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef"
            )
        return self


class EnvVar(ApiModel):
    """An environment variable of the runtime container, as in a Pod."""

    name: str = Field(min_length=1, max_length=256, description="Variable name.")
    value: str | None = Field(default=None, description="Literal value.")
    value_from: EnvVarSource | None = Field(
        default=None,
        description="A source for the value (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef).",
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
        default=None,
        max_length=1024,
        description="Runtime image; unset: the operator's slim runtime image for a versionCompatible "
        "engine, its full runtime image otherwise.",
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


class LLMServer(StrEnum):
    """The server an LLM runtime pod runs under ``trtforge serve-llm`` (docs/llm.md §"Serving")."""

    LLAMA_CPP = "llama.cpp"  # llama.cpp's llama-server: CPU targets (the test bed)
    TRTLLM_SERVE = "trtllm-serve"  # TensorRT-LLM's OpenAI server: GPU targets


class GroupBackend(StrEnum):
    """Who makes a replica's rank pods when it spans nodes (docs/llm.md §"Groups")."""

    NATIVE = "native"  # the operator creates and owns the rank pods
    LWS = "lws"  # one LeaderWorkerSet (leaderworkerset.x-k8s.io/v1), where its CRD is installed


SUPERVISOR_FLAGS = frozenset(
    {"--host", "--port", "-m", "--model", "--metrics", "--alias", "--tp_size", "--pp_size", "--config"}
)
"""Server flags ``trtforge serve-llm`` sets itself; ``llm.args`` may not repeat them."""


class LLMServing(ApiModel):
    """How an LLM engine is served: the server, its extra arguments and the OpenAI port."""

    server: LLMServer | None = Field(
        default=None,
        description="llama.cpp (CPU targets) or trtllm-serve (GPU targets); unset: llama.cpp on a cpu "
        "target, trtllm-serve on a GPU.",
    )
    args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Further arguments for the server (after `--` of `trtforge serve-llm`), e.g. "
        "[--ctx-size, '4096']. Flags the supervisor sets (--host, --port, --model, --metrics, "
        "--tp_size, --pp_size, --config) are refused.",
    )
    port: int = Field(
        default=8080,
        ge=1,
        le=65535,
        description="The server's own port: the OpenAI API (/v1/chat/completions, /v1/completions, "
        "/v1/models), exposed by the Service as the port named openai. runtime.port carries the "
        "probes and /metrics.",
    )
    canary_prompt: str | None = Field(
        default=None,
        max_length=4096,
        description="The canary prompt readiness is gated on; unset: the engine's. Golden tokens "
        "exist only for the prompt the engine's quantize Job ran, so another prompt holds the "
        "rollout (CanaryPromptMismatch) instead of serving ungated.",
    )
    group_backend: GroupBackend = Field(
        default=GroupBackend.NATIVE,
        description="Where a target's tensor x pipeline exceeds one node's GPUs, each replica is a "
        "group of rank pods: native (the operator makes and owns them) or lws (a LeaderWorkerSet; "
        "refused with a condition where its CRD is not installed). Replicas count groups.",
    )

    @field_validator("args")
    @classmethod
    def _no_supervisor_flags(cls, v: list[str]) -> list[str]:
        for a in v:
            if a.split("=", 1)[0] in SUPERVISOR_FLAGS:
                raise ValueError(
                    f"llm.args: {a!r} is set by trtforge serve-llm itself; expected none of "
                    f"{', '.join(sorted(SUPERVISOR_FLAGS))}"
                )
        return v


_UNIQUE_TARGETS = (
    "self.all(t, self.exists_one(u, u.gpu == t.gpu && "
    "(has(u.mig) ? u.mig : '') == (has(t.mig) ? t.mig : '')))"
)


class InferenceDeploymentSpec(ApiModel):
    """Serve a TRTEngine of this namespace on its GPU targets."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.llm) || !has(self.llm.port) || !has(self.runtime.port) "
                    "|| self.llm.port != self.runtime.port",
                    "message": "llm.port must differ from runtime.port",
                },
            ]
        }
    )

    engine_ref: EngineReference = Field(description="The TRTEngine (same namespace) to serve.")
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Replicas in all (the scale subresource's spec.replicas: kubectl scale, an HPA or "
        "KEDA may set it). They are split over the served targets in proportion to their shares "
        "(targets[].replicas, 1 where unset; every engine target has share 1 without targets): each "
        "gets floor(replicas x share / sum of shares), and the replicas left over go one each to the "
        "targets with the largest remainders, ties to the engine's target order. A target with "
        "autoscaling starts with its split clamped to [minReplicas, maxReplicas]; its autoscaler sets "
        "its count from then on. A target whose share is 0 is not autoscaled and has no pods.",
    )
    targets: list[DeploymentTarget] = Field(
        default_factory=list,
        max_length=MAX_TARGETS,
        description="Serve only these engine targets (each with its share of the replicas and its own "
        "autoscaling, optionally); empty: all.",
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
    llm: LLMServing | None = Field(
        default=None,
        description="Serving an LLM engine (a TRTEngine with spec.llm): the server, its arguments, "
        "the OpenAI port and the canary prompt; unset: the defaults. Refused for an ONNX engine.",
    )
    autoscaling: Autoscaling | None = Field(
        default=None,
        description="Autoscaling of every target without its own: the operator creates and owns one "
        "autoscaler per target Deployment (a HorizontalPodAutoscaler, or a KEDA ScaledObject with "
        "provider KEDA; minReplicas and maxReplicas count that target's pods) and stops writing those "
        "Deployments' replicas.",
        json_schema_extra={"x-kubernetes-validations": _AUTOSCALING_RULES},
    )

    @model_validator(mode="after")
    def _unique(self) -> InferenceDeploymentSpec:
        if self.runtime.grpc_port == self.runtime.port:
            raise ValueError(f"runtime.grpcPort must differ from runtime.port ({self.runtime.port})")
        if self.llm is not None and self.llm.port == self.runtime.port:
            raise ValueError(f"llm.port must differ from runtime.port ({self.runtime.port})")
        seen = set()
        for t in self.targets:
            if (t.gpu, t.mig) in seen:
                raise ValueError(f"targets must be unique (gpu, mig) pairs; {t.gpu}/{t.mig} repeats")
            seen.add((t.gpu, t.mig))
        return self

    def replicas_by_target(self, engine_targets: Iterable[GPUTarget]) -> dict[GPUTarget, int]:
        """Replicas wanted per engine target, in the engine's order: ``spec.replicas`` split over the
        served targets by their shares (:func:`split_replicas`)."""
        engine = list(dict.fromkeys(engine_targets))
        if not self.targets:
            return split_replicas(self.replicas, dict.fromkeys(engine, 1))
        share = {t.to_contract(): (1 if t.replicas is None else t.replicas) for t in self.targets}
        return split_replicas(self.replicas, {t: share[t] for t in engine if t in share})

    def autoscaling_by_target(self, targets: Iterable[GPUTarget]) -> dict[GPUTarget, Autoscaling | None]:
        """Each target's autoscaling: its own (``spec.targets[]``), else ``spec.autoscaling``; none
        for a target whose share is 0: it serves nothing (no pods, no autoscaler), whatever
        ``minReplicas`` says, e.g. a target held dark until its share is raised."""
        own = {t.to_contract(): t for t in self.targets}

        def of(t: GPUTarget) -> Autoscaling | None:
            entry = own.get(t)
            if entry is not None and entry.replicas == 0:
                return None
            return (entry.autoscaling if entry is not None else None) or self.autoscaling

        return {t: of(t) for t in targets}


# -------------------------------------------------------------------------------------------- status


class DeploymentTargetStatus(ApiModel):
    """Serving state on one GPU target."""

    name: str = Field(max_length=63, description="Target name (GPUTarget.name).")
    gpu: str | None = Field(default=None, max_length=63, description="nvidia.com/gpu.product value or cpu.")
    mig: str | None = Field(default=None, max_length=32, description="MIG profile, unset for the full GPU.")
    engine_key: str | None = Field(default=None, max_length=64, description="Engine key being served.")
    deployment_name: str | None = Field(default=None, max_length=253, description="The Deployment.")
    replicas: int = Field(
        default=0, ge=0, description="Pods wanted: the split of spec.replicas, or what the HPA set."
    )
    current_replicas: int = Field(default=0, ge=0, description="Pods there are (the Deployment's).")
    ready_replicas: int = Field(default=0, ge=0, description="Pods Ready.")
    autoscaler: str | None = Field(
        default=None,
        max_length=253,
        description="The autoscaler (HorizontalPodAutoscaler or ScaledObject, see autoscalerKind) that "
        "sets replicas here.",
    )
    autoscaler_kind: str | None = Field(
        default=None, max_length=63, description="HorizontalPodAutoscaler or ScaledObject."
    )
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
    replicas: int | None = Field(
        default=None,
        ge=0,
        description="Pods there are, all targets (the scale subresource's status.replicas).",
    )
    desired_replicas: int | None = Field(
        default=None,
        ge=0,
        description="Pods wanted, all targets: spec.replicas, or what the autoscalers set.",
    )
    ready_replicas: int | None = Field(default=None, ge=0, description="Pods Ready, all targets.")
    selector: str | None = Field(
        default=None,
        max_length=1024,
        description="Label selector of the runtime pods, as text (the scale subresource's selector).",
    )
    ready: str | None = Field(
        default=None, max_length=32, description='Ready pods out of wanted, like "2/3".'
    )
    endpoint: str | None = Field(
        default=None,
        max_length=1024,
        description="In-cluster URL of the Service: KServe v2 protocol, or for an LLM the OpenAI API "
        "(its /v1 base URL).",
    )
    server: LLMServer | None = Field(
        default=None, description="The LLM server the pods run (llama.cpp or trtllm-serve); unset for ONNX."
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
    SCALE: ClassVar[dict[str, str] | None] = {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    PRINTER_COLUMNS: ClassVar[list[dict[str, Any]]] = [
        {"name": "Engine", "type": "string", "jsonPath": ".spec.engineRef.name"},
        {
            "name": "Desired",
            "type": "integer",
            "jsonPath": ".status.desiredReplicas",
            "description": "Pods wanted (spec.replicas, or what the autoscalers set)",
        },
        {
            "name": "Current",
            "type": "integer",
            "jsonPath": ".status.replicas",
            "description": "Pods there are",
        },
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
        {
            "name": "Server",
            "type": "string",
            "jsonPath": ".status.server",
            "description": "The LLM server (llama.cpp or trtllm-serve); empty for ONNX engines",
            "priority": 1,
        },
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint", "priority": 1},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]

    api_version: Literal["trtforge.io/v1alpha1"] = API_VERSION
    kind: Literal["InferenceDeployment"] = "InferenceDeployment"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: InferenceDeploymentSpec
    status: InferenceDeploymentStatus = Field(default_factory=InferenceDeploymentStatus)
