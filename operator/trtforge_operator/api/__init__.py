"""trtforge.io/v1alpha1 API models: the one source of truth for the CRDs and the operator.

Resources: :class:`TRTEngine` (spec :class:`TRTEngineSpec`, status :class:`TRTEngineStatus` with
:class:`TargetStatus` per GPU target) and :class:`InferenceDeployment` (spec
:class:`InferenceDeploymentSpec`, status :class:`InferenceDeploymentStatus`). Read a live object with
``TRTEngine.model_validate(body)``; write status with ``status.to_wire()`` (camelCase, no nulls).

Helpers: ``TRTEngineSpec.build_config()``, ``.resolved_targets(discovered)``, ``.validation_settings()``,
``InferenceDeploymentSpec.replicas_by_target(engine_targets)``, :func:`set_condition`,
:func:`get_condition`, :func:`ready_text`, :func:`parse_quantity`, :func:`quantity_to_bytes`.
CRDs and docs/api.md are generated from these models by :mod:`trtforge_operator.crdgen`.
"""

from trtforge.contract.quantity import QuantityError, parse_quantity, quantity_to_bytes
from trtforge_operator.api.common import (
    API_VERSION,
    GROUP,
    VERSION,
    ApiModel,
    Condition,
    LocalObjectReference,
    ObjectMeta,
    get_condition,
    now,
    ready_text,
    set_condition,
)
from trtforge_operator.api.inferencedeployment import (
    CUSTOM_METRIC_NAMES,
    MAX_FAULTS,
    SCALE_TO_ZERO_MESSAGE,
    Autoscaling,
    AutoscalingMetric,
    Batching,
    DeploymentTarget,
    DeploymentTargetStatus,
    EngineReference,
    EnvVar,
    FaultPolicy,
    FaultRecord,
    InferenceDeployment,
    InferenceDeploymentSpec,
    InferenceDeploymentStatus,
    ResourceRequirements,
    Rollout,
    RuntimeSettings,
    Toleration,
    split_replicas,
)
from trtforge_operator.api.trtengine import (
    DEFAULT_TOLERANCES,
    Accuracy,
    AutoTargets,
    BuilderSettings,
    EngineTarget,
    ModelSource,
    OptimizationProfile,
    SecretReference,
    ShapeRangeSpec,
    TargetStatus,
    TRTEngine,
    TRTEngineSpec,
    TRTEngineStatus,
    ValidationSettings,
    ValidationSpec,
    VerifiedModel,
)

RESOURCES = (TRTEngine, InferenceDeployment)
"""The kinds of this API, in CRD generation order."""

__all__ = [
    "API_VERSION",
    "CUSTOM_METRIC_NAMES",
    "DEFAULT_TOLERANCES",
    "GROUP",
    "MAX_FAULTS",
    "RESOURCES",
    "SCALE_TO_ZERO_MESSAGE",
    "VERSION",
    "Accuracy",
    "ApiModel",
    "AutoTargets",
    "Autoscaling",
    "AutoscalingMetric",
    "Batching",
    "BuilderSettings",
    "Condition",
    "DeploymentTarget",
    "DeploymentTargetStatus",
    "EngineReference",
    "EngineTarget",
    "EnvVar",
    "FaultPolicy",
    "FaultRecord",
    "InferenceDeployment",
    "InferenceDeploymentSpec",
    "InferenceDeploymentStatus",
    "LocalObjectReference",
    "ModelSource",
    "ObjectMeta",
    "OptimizationProfile",
    "QuantityError",
    "ResourceRequirements",
    "Rollout",
    "RuntimeSettings",
    "SecretReference",
    "ShapeRangeSpec",
    "TRTEngine",
    "TRTEngineSpec",
    "TRTEngineStatus",
    "TargetStatus",
    "Toleration",
    "ValidationSettings",
    "ValidationSpec",
    "VerifiedModel",
    "get_condition",
    "now",
    "parse_quantity",
    "quantity_to_bytes",
    "ready_text",
    "set_condition",
    "split_replicas",
]
