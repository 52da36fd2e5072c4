"""The CRDs' CEL rules (x-kubernetes-validations), evaluated offline with cel-python.

The test bed's 1.20 apiserver does not run them, so here each rule is applied where the apiserver would
apply it: walking the object alongside the generated CRD schema (after schema defaulting), with `self`
bound to the node the rule sits on. Every case is also checked against the Python models, so both
layers refuse the same objects.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from pydantic import BaseModel, ValidationError
from trtforge_operator import crdgen
from trtforge_operator.api import InferenceDeployment, InferenceDeploymentSpec, TRTEngine, TRTEngineSpec

ROOT = Path(__file__).resolve().parents[2]
ENV = celpy.Environment()
SCHEMAS = {
    r.KIND: crdgen.crd_manifest(r)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for r in (TRTEngine, InferenceDeployment)
}


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Schema defaulting the way the apiserver does it: missing properties with a default get it."""
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                apply_defaults(sub, obj[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for v in obj.values():
                apply_defaults(extra, v)
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            apply_defaults(schema["items"], item)
    return obj


def _rule_sites(schema: dict[str, Any], obj: Any, path: str) -> Iterator[tuple[str, dict[str, str], Any]]:
    for rule in schema.get("x-kubernetes-validations", []):
        yield path, rule, obj
    if isinstance(obj, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in obj:
                yield from _rule_sites(sub, obj[name], f"{path}.{name}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for k, v in obj.items():
                yield from _rule_sites(extra, v, f"{path}[{k}]")
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            yield from _rule_sites(schema["items"], item, f"{path}[{i}]")


def cel_violations(kind: str, spec: dict[str, Any]) -> list[str]:
    """`<path>: <message>` for every rule that does not hold on this (defaulted) spec."""
    schema = SCHEMAS[kind]["properties"]["spec"]
    spec = apply_defaults(schema, copy.deepcopy(spec))
    out = []
    for path, rule, node in _rule_sites(schema, spec, "spec"):
        result = ENV.program(ENV.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(node)})
        assert isinstance(result, celpy.celtypes.BoolType), f"{rule['rule']} on {node} gave {result!r}"
        if not result:
            out.append(f"{path}: {rule['message']}")
    return out


def _engine(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"uri": "pvc://models/m.onnx"},
        "targets": [{"gpu": "NVIDIA-H100-80GB-HBM3"}],
    }
    spec.update(over)
    return {k: v for k, v in spec.items() if v is not None}  # None: leave the field out


LLM: dict[str, Any] = {
    "source": {"uri": "https://models.example/smollm2.gguf", "sha256": "a" * 64, "format": "gguf"},
    "recipe": "bf16",
    "calibration": {"dataset": "cnn_dailymail", "samples": 64, "sequenceLength": 256},
    "canary": {"prompt": "The capital of France is", "maxTokens": 8},
}


def _range(mn: list[int], opt: list[int], mx: list[int]) -> dict[str, Any]:
    return {"inputs": {"x": {"min": mn, "opt": opt, "max": mx}}}


def test_every_rule_compiles() -> None:
    n = 0
    for kind in SCHEMAS:
        for _, rule, _ in _rule_sites_all(SCHEMAS[kind]):
            ENV.compile(rule["rule"])
            assert rule["message"]
            n += 1
    assert n >= 6


def _rule_sites_all(schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, str], None]]:
    for rule in schema.get("x-kubernetes-validations", []):
        yield "", rule, None
    for sub in schema.get("properties", {}).values():
        yield from _rule_sites_all(sub)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _rule_sites_all(schema[key])


def test_examples_pass_every_rule() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert cel_violations(doc["kind"], doc["spec"]) == [], path.name


VALID_ENGINES = [
    _engine(),
    _engine(targets=[{"gpu": "NVIDIA-B200"}, {"gpu": "NVIDIA-B200", "mig": "3g.90gb"}]),
    _engine(targets=[], autoTargets={"enabled": True}),
    _engine(targets=None, autoTargets={"enabled": True, "includeMIG": False}),
    _engine(autoTargets={"enabled": False}),
    _engine(profiles=[_range([1, 3], [4, 3], [8, 3])]),
    _engine(profiles=[_range([1], [1], [1]), _range([2], [4], [8])]),
    _engine(profiles=[_range([1, 1, 1, 1, 1, 1, 1, 1], [1, 2, 3, 4, 5, 6, 7, 8], [8, 8, 8, 8, 8, 8, 8, 8])]),
    _engine(model={"uri": "s3://bucket/m.onnx", "secretRef": {"name": "creds"}}),
    _engine(targets=[{"gpu": "cpu"}]),
    _engine(model=None, llm=LLM),
    _engine(model=None, llm=LLM, targets=[{"gpu": "NVIDIA-H100-80GB-HBM3", "parallelism": {"tensor": 4}}]),
]

INVALID_ENGINES = [
    (_engine(targets=[]), "set either targets or autoTargets.enabled"),
    (_engine(autoTargets={"enabled": True}), "set either targets or autoTargets.enabled"),
    (_engine(targets=[], autoTargets={"enabled": False}), "set either targets or autoTargets.enabled"),
    (_engine(targets=[], autoTargets={}), "set either targets or autoTargets.enabled"),
    (_engine(profiles=[_range([2], [1], [4])]), "min <= opt <= max"),
    (_engine(profiles=[_range([1, 8], [4, 9], [8, 8])]), "min <= opt <= max"),
    (
        _engine(profiles=[_range([1, 1, 1, 1, 1, 1, 1, 2], [1, 1, 1, 1, 1, 1, 1, 1], [9] * 8)]),
        "min <= opt <= max",
    ),
    (_engine(profiles=[_range([1], [1, 2], [4])]), "same number of dimensions"),
    (
        _engine(profiles=[_range([1], [1], [1]), {"inputs": {"y": {"min": [1], "opt": [1], "max": [1]}}}]),
        "every profile must list the same inputs",
    ),
    (_engine(targets=[{"gpu": "NVIDIA-B200"}, {"gpu": "NVIDIA-B200"}]), "targets must be unique"),
    (_engine(targets=[{"gpu": "NVIDIA-B200", "mig": "1g.23gb"}] * 2), "targets must be unique"),
    (_engine(targets=[{"gpu": "cpu", "mig": "1g.10gb"}]), "a cpu target has no MIG profile"),
    (_engine(model={"uri": "pvc://models/m.onnx", "secretRef": {"name": "creds"}}), "secretRef applies to"),
    (_engine(builder={"stripWeights": True}), "stripWeights is not supported yet"),
    (_engine(llm=LLM), "set either model (an ONNX model) or llm"),
    (_engine(model=None), "set either model (an ONNX model) or llm"),
    (
        _engine(targets=[{"gpu": "NVIDIA-H100-80GB-HBM3", "parallelism": {"tensor": 2}}]),
        "targets[].parallelism applies to llm engines only",
    ),
    (
        _engine(model=None, llm={**LLM, "source": {"uri": "pvc://m/x.gguf", "secretRef": {"name": "c"}}}),
        "secretRef applies to",
    ),
]


@pytest.mark.parametrize("spec", VALID_ENGINES)
def test_valid_engines(spec: dict[str, Any]) -> None:
    spec = {k: v for k, v in spec.items() if v is not None}
    assert cel_violations("TRTEngine", spec) == []
    TRTEngineSpec.model_validate(spec)


@pytest.mark.parametrize(("spec", "message"), INVALID_ENGINES)
def test_invalid_engines_refused_by_cel_and_models(spec: dict[str, Any], message: str) -> None:
    violations = cel_violations("TRTEngine", spec)
    assert len(violations) == 1 and message in violations[0], violations
    _refused(TRTEngineSpec, spec)


def test_rule_paths_point_at_the_offending_node() -> None:
    v = cel_violations("TRTEngine", _engine(profiles=[_range([1], [1], [1]), _range([1], [3], [2])]))
    assert v == ["spec.profiles[1].inputs[x]: every dimension must satisfy min <= opt <= max"]


def test_deployment_rules() -> None:
    ok = {
        "engineRef": {"name": "e"},
        "targets": [{"gpu": "NVIDIA-B200"}, {"gpu": "NVIDIA-B200", "mig": "3g.90gb"}],
    }
    assert cel_violations("InferenceDeployment", ok) == []
    dup = {
        "engineRef": {"name": "e"},
        "targets": [{"gpu": "cpu", "replicas": 1}, {"gpu": "cpu", "replicas": 2}],
    }
    assert cel_violations("InferenceDeployment", dup) == [
        "spec.targets: targets must be unique (gpu, mig) pairs"
    ]
    _refused(InferenceDeploymentSpec, dup)
    same_ports = {"engineRef": {"name": "e"}, "runtime": {"port": 9000, "grpcPort": 9000}}
    assert cel_violations("InferenceDeployment", same_ports) == [
        "spec.runtime: runtime.grpcPort must differ from runtime.port"
    ]
    _refused(InferenceDeploymentSpec, same_ports)
    assert (
        cel_violations("InferenceDeployment", {"engineRef": {"name": "e"}, "runtime": {"grpcPort": 9001}})
        == []
    )


def _refused(model: type[BaseModel], spec: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(spec)


AUTOSCALING = {"minReplicas": 1, "maxReplicas": 4, "metric": "RequestsInFlight", "targetValue": 4}
INVALID_AUTOSCALING = [
    ({**AUTOSCALING, "minReplicas": 5, "maxReplicas": 2}, "minReplicas must not be greater than maxReplicas"),
    ({**AUTOSCALING, "minReplicas": 0}, "scale to zero is not supported"),
]


@pytest.mark.parametrize(("auto", "message"), INVALID_AUTOSCALING)
def test_autoscaling_rules_for_all_and_per_target(auto: dict[str, Any], message: str) -> None:
    for spec, path in (
        ({"engineRef": {"name": "e"}, "autoscaling": auto}, "spec.autoscaling"),
        (
            {"engineRef": {"name": "e"}, "targets": [{"gpu": "cpu", "autoscaling": auto}]},
            "spec.targets[0].autoscaling",
        ),
    ):
        violations = cel_violations("InferenceDeployment", spec)
        assert len(violations) == 1 and violations[0].startswith(f"{path}: ") and message in violations[0]
        _refused(InferenceDeploymentSpec, spec)


def test_autoscaling_schema_refuses_what_cel_need_not() -> None:
    """An unknown metric and minReplicas below 1 are refused by the schema itself (every version)."""
    auto = SCHEMAS["InferenceDeployment"]["properties"]["spec"]["properties"]["autoscaling"]
    assert auto["properties"]["metric"]["enum"] == [
        "RequestsInFlight",
        "QueueDepth",
        "RequestRate",
        "KVCacheUtilization",
    ]
    assert auto["properties"]["minReplicas"]["minimum"] == 1
    assert auto["required"] == ["maxReplicas", "targetValue"]
    per_target = SCHEMAS["InferenceDeployment"]["properties"]["spec"]["properties"]["targets"]["items"]
    same = {k: v for k, v in per_target["properties"]["autoscaling"].items() if k != "description"}
    assert same == {k: v for k, v in auto.items() if k != "description"}
    ok = {"engineRef": {"name": "e"}, "autoscaling": AUTOSCALING}
    assert cel_violations("InferenceDeployment", ok) == []
    InferenceDeploymentSpec.model_validate(ok)
