"""API models: parsing the examples, defaults, helpers the operator uses, Python-side validation."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from trtforge_operator.api import (
    DEFAULT_TOLERANCES,
    MAX_FAULTS,
    FaultRecord,
    InferenceDeployment,
    InferenceDeploymentSpec,
    TargetStatus,
    TRTEngine,
    TRTEngineSpec,
    TRTEngineStatus,
    get_condition,
    ready_text,
    set_condition,
    split_replicas,
)

from trtforge.contract.engine_key import BuildConfig, ShapeRange
from trtforge.contract.gpu import GPUTarget

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
H100 = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
B200_MIG = GPUTarget(gpu="NVIDIA-B200", mig="3g.90gb")


def _spec(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"uri": "pvc://models/m.onnx"},
        "targets": [{"gpu": "NVIDIA-H100-80GB-HBM3"}],
    }
    spec.update(over)
    return spec


def test_examples_exist_and_parse() -> None:
    kinds = set()
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            kinds.add(doc["kind"])
            model: type[TRTEngine] | type[InferenceDeployment] = (
                TRTEngine if doc["kind"] == "TRTEngine" else InferenceDeployment
            )
            obj = model.model_validate(doc)
            assert obj.metadata.name
    assert kinds == {"TRTEngine", "InferenceDeployment"}


def test_example_engine_covers_two_gpu_types_and_a_mig_slice() -> None:
    engine = TRTEngine.model_validate(
        yaml.safe_load((ROOT / "examples/trtengine-squeezenet.yaml").read_text())
    )
    targets = engine.spec.resolved_targets()
    assert len({t.gpu for t in targets}) == 2
    assert any(t.mig for t in targets)


def test_spec_defaults_match_the_issue() -> None:
    spec = TRTEngineSpec.model_validate(_spec())
    assert spec.precision == "fp16"
    assert spec.builder.optimization_level == 3
    assert spec.builder.timing_cache is True
    assert spec.builder.hardware_compatibility == "none"
    assert spec.builder.workspace is None
    infd = InferenceDeploymentSpec.model_validate({"engineRef": {"name": "e"}})
    assert infd.replicas == 1
    assert infd.runtime.port == 8000
    assert infd.fault_policy.rebuild_on_gpu_fault is True
    assert infd.fault_policy.max_rebuilds_per_hour == 3
    assert infd.rollout.max_unavailable == 0


def test_camel_case_wire_and_snake_case_python() -> None:
    spec = TRTEngineSpec.model_validate(_spec(builder={"optimizationLevel": 5, "versionCompatible": True}))
    assert spec.builder.optimization_level == 5
    by_name = TRTEngineSpec(
        model={"uri": "pvc://models/m.onnx"},
        targets=[{"gpu": "cpu"}],
        builder={"optimization_level": 1},
    )
    assert by_name.builder.optimization_level == 1
    wire = spec.to_wire()
    assert wire["builder"]["optimizationLevel"] == 5 and "optimization_level" not in wire["builder"]
    assert TRTEngineSpec.model_validate(wire) == spec
    assert "sha256" not in wire["model"]  # None left out
    auto = TRTEngineSpec.model_validate(_spec(targets=[], autoTargets={"enabled": True, "includeMIG": False}))
    assert auto.to_wire()["autoTargets"]["includeMIG"] is False
    faults = InferenceDeploymentSpec.model_validate(
        {"engineRef": {"name": "e"}, "faultPolicy": {"rebuildOnGPUFault": False}}
    )
    assert faults.to_wire()["faultPolicy"]["rebuildOnGPUFault"] is False


def test_strip_weights_is_refused_until_the_runtime_refits() -> None:
    """Weight-stripped engines would need a refit in the runtime, which it does not do: refused."""
    with pytest.raises(ValidationError, match="stripWeights is not supported yet"):
        TRTEngineSpec.model_validate(_spec(builder={"stripWeights": True}))
    assert TRTEngineSpec.model_validate(_spec(builder={"stripWeights": False})).builder.strip_weights is False


def test_build_config() -> None:
    spec = TRTEngineSpec.model_validate(
        _spec(
            precision="int8",
            profiles=[
                {"inputs": {"x": {"min": [1, 3], "opt": [4, 3], "max": [8, 3]}}},
                {"inputs": {"x": {"min": [8, 3], "opt": [16, 3], "max": [32, 3]}}},
            ],
            builder={
                "optimizationLevel": 4,
                "workspace": "1.5Gi",
                "hardwareCompatibility": "amperePlus",
                "versionCompatible": True,
                "timingCache": False,
                "timeoutSeconds": 120,
            },
        )
    )
    assert spec.build_config() == BuildConfig(
        precision="int8",
        profiles=(
            {"x": ShapeRange(min=(1, 3), opt=(4, 3), max=(8, 3))},
            {"x": ShapeRange(min=(8, 3), opt=(16, 3), max=(32, 3))},
        ),
        optimization_level=4,
        workspace_bytes=1536 * 1024 * 1024,
        hardware_compatibility="amperePlus",
        version_compatible=True,
    )
    assert TRTEngineSpec.model_validate(_spec()).build_config() == BuildConfig()
    # timing cache and timeout do not decide the engine
    a = TRTEngineSpec.model_validate(_spec(builder={"timingCache": False, "timeoutSeconds": 99999 // 2}))
    assert a.build_config() == BuildConfig()
    assert TRTEngineSpec.model_validate(_spec(builder={"workspace": 1024})).workspace_bytes() == 1024


def test_resolved_targets_explicit_and_auto() -> None:
    spec = TRTEngineSpec.model_validate(
        _spec(targets=[{"gpu": "NVIDIA-H100-80GB-HBM3"}, {"gpu": "NVIDIA-B200", "mig": "3g.90gb"}])
    )
    assert spec.resolved_targets() == [H100, B200_MIG]
    assert spec.resolved_targets([GPUTarget(gpu="cpu")]) == [H100, B200_MIG]  # discovered ignored

    auto = TRTEngineSpec.model_validate(_spec(targets=[], autoTargets={"enabled": True}))
    found = [B200_MIG, H100, H100, GPUTarget(gpu="NVIDIA-B200")]
    assert auto.resolved_targets(found) == sorted(
        {H100, B200_MIG, GPUTarget(gpu="NVIDIA-B200")}, key=lambda t: t.name
    )
    assert auto.resolved_targets() == []
    no_mig = TRTEngineSpec.model_validate(
        _spec(targets=[], autoTargets={"enabled": True, "includeMIG": False})
    )
    assert B200_MIG not in no_mig.resolved_targets(found)
    sel = TRTEngineSpec.model_validate(
        _spec(targets=[], autoTargets={"enabled": True, "nodeSelector": {"pool": "a"}})
    )
    assert sel.auto_targets is not None
    assert sel.auto_targets.selects({"pool": "a", "x": "y"})
    assert not sel.auto_targets.selects({"pool": "b"})


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "int8", "fp8", "auto"])
def test_validation_tolerances_default_per_precision(precision: str) -> None:
    spec = TRTEngineSpec.model_validate(_spec(precision=precision))
    v = spec.validation_settings()
    assert (v.samples, v.rtol, v.atol) == (
        8,
        DEFAULT_TOLERANCES[precision].rtol,
        DEFAULT_TOLERANCES[precision].atol,
    )
    own = TRTEngineSpec.model_validate(_spec(precision=precision, validation={"samples": 3, "rtol": 0.2}))
    v = own.validation_settings()
    assert (v.samples, v.rtol, v.atol) == (3, 0.2, DEFAULT_TOLERANCES[precision].atol)


def test_tolerances_loosen_with_lower_precision() -> None:
    order = ["fp32", "fp16", "bf16", "int8"]
    rtols = [DEFAULT_TOLERANCES[p].rtol for p in order]
    assert rtols == sorted(rtols)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (_spec(precision="fp4"), "precision"),
        (_spec(builder={"optimizationLevel": 7}), "optimizationLevel"),
        (_spec(targets=[{"mig": "1g.10gb"}]), "gpu"),
        (_spec(model={"uri": "ftp://host/m.onnx"}), "uri"),
        (_spec(model={"uri": "pvc://models/../trtforge-store/engines/x"}), "uri"),
        (_spec(model={"uri": "pvc://models//etc/passwd"}), "uri"),
        (_spec(model={"uri": "pvc://models/a/./b.onnx"}), "uri"),
        (_spec(model={"uri": "pvc://models/a/.."}), "uri"),
        (_spec(model={"uri": "pvc://models/m.onnx", "sha256": "ABC"}), "sha256"),
        ({"targets": [{"gpu": "cpu"}]}, "model"),
        (_spec(targets=[]), "not both"),
        (_spec(autoTargets={"enabled": True}), "not both"),
        (_spec(targets=[{"gpu": "cpu"}, {"gpu": "cpu"}]), "unique"),
        (_spec(targets=[{"gpu": "cpu", "mig": "1g.10gb"}]), "cpu target"),
        (_spec(targets=[{"gpu": "NVIDIA-B200", "mig": "3g"}]), "mig"),
        (_spec(builder={"workspace": "2GB"}), "workspace"),
        (_spec(builder={"workspace": "-1Gi"}), "workspace"),
        (_spec(profiles=[{"inputs": {"x": {"min": [2], "opt": [1], "max": [4]}}}]), "min <= opt <= max"),
        (_spec(profiles=[{"inputs": {"x": {"min": [1], "opt": [1, 2], "max": [4]}}}]), "same rank"),
        (
            _spec(
                profiles=[
                    {"inputs": {"x": {"min": [1], "opt": [1], "max": [1]}}},
                    {"inputs": {"y": {"min": [1], "opt": [1], "max": [1]}}},
                ]
            ),
            "same inputs",
        ),
        (_spec(model={"uri": "pvc://models/m.onnx", "secretRef": {"name": "s"}}), "secretRef"),
    ],
)
def test_invalid_engine_specs_name_the_problem(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TRTEngineSpec.model_validate(spec)


@pytest.mark.parametrize(
    "uri",
    [
        "s3://my-bucket/models/m.onnx",
        "pvc://models/a/b.onnx",
        "pvc://models/.hidden/..b.onnx",
        "https://models.example.com/m.onnx",
    ],
)
def test_model_uri_schemes(uri: str) -> None:
    TRTEngineSpec.model_validate(_spec(model={"uri": uri}))


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"engineRef": {"name": "e"}, "replicas": -1}, "replicas"),
        ({"engineRef": {"name": "e"}, "targets": [{"gpu": "cpu", "replicas": -2}]}, "replicas"),
        ({"replicas": 1}, "engineRef"),
        ({"engineRef": {"name": "E!"}}, "name"),
        ({"engineRef": {"name": "e"}, "rollout": {"maxSurge": "ten"}}, "maxSurge"),
        ({"engineRef": {"name": "e"}, "runtime": {"resources": {"limits": {"memory": "2GB"}}}}, "memory"),
        ({"engineRef": {"name": "e"}, "runtime": {"port": 70000}}, "port"),
        ({"engineRef": {"name": "e"}, "targets": [{"gpu": "cpu"}, {"gpu": "cpu"}]}, "unique"),
    ],
)
def test_invalid_deployment_specs_name_the_problem(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        InferenceDeploymentSpec.model_validate(spec)


def test_replicas_by_target_splits_spec_replicas_by_shares() -> None:
    engine = [H100, B200_MIG]
    all_ = InferenceDeploymentSpec.model_validate({"engineRef": {"name": "e"}, "replicas": 4})
    assert all_.replicas_by_target(engine) == {H100: 2, B200_MIG: 2}
    odd = InferenceDeploymentSpec.model_validate({"engineRef": {"name": "e"}, "replicas": 3})
    assert odd.replicas_by_target(engine) == {H100: 2, B200_MIG: 1}  # the tie goes to the engine's first
    subset = InferenceDeploymentSpec.model_validate(
        {
            "engineRef": {"name": "e"},
            "replicas": 3,
            "targets": [{"gpu": "NVIDIA-B200", "mig": "3g.90gb", "replicas": 0}, {"gpu": "NVIDIA-H200"}],
        }
    )
    # only targets the engine has; a share of 0 gets nothing
    assert subset.replicas_by_target(engine) == {B200_MIG: 0}
    weighted = InferenceDeploymentSpec.model_validate(
        {
            "engineRef": {"name": "e"},
            "replicas": 6,
            "targets": [
                {"gpu": "NVIDIA-H100-80GB-HBM3", "replicas": 2},
                {"gpu": "NVIDIA-B200", "mig": "3g.90gb"},
            ],
        }
    )
    assert weighted.replicas_by_target(engine) == {H100: 4, B200_MIG: 2}
    with_default = InferenceDeploymentSpec.model_validate(
        {"engineRef": {"name": "e"}, "targets": [{"gpu": "NVIDIA-H100-80GB-HBM3"}]}
    )
    assert with_default.replicas_by_target(engine) == {H100: 1}


A, B, C = GPUTarget(gpu="a"), GPUTarget(gpu="b"), GPUTarget(gpu="c")


@pytest.mark.parametrize(
    ("total", "shares", "expected"),
    [
        (3, {A: 2, B: 1}, {A: 2, B: 1}),  # shares summing to the total: exactly the shares
        (9, {A: 2, B: 1}, {A: 6, B: 3}),  # proportional
        (4, {A: 2, B: 1}, {A: 3, B: 1}),  # 2.67 / 1.33: the larger remainder gets the extra one
        (5, {A: 1, B: 1, C: 1}, {A: 2, B: 2, C: 1}),  # equal remainders: the earlier targets
        (1, {A: 1, B: 1, C: 1}, {A: 1, B: 0, C: 0}),  # fewer replicas than targets
        (7, {A: 1, B: 0, C: 1}, {A: 4, B: 0, C: 3}),  # share 0: nothing
        (5, {A: 0, B: 0}, {A: 0, B: 0}),  # no share at all
        (0, {A: 3, B: 1}, {A: 0, B: 0}),
        (1000, {A: 3, B: 3, C: 1}, {A: 429, B: 428, C: 143}),
        (5, {}, {}),
    ],
)
def test_split_replicas(total: int, shares: dict[GPUTarget, int], expected: dict[GPUTarget, int]) -> None:
    got = split_replicas(total, shares)
    assert got == expected
    assert list(got) == list(shares)  # the targets' order is kept
    if any(shares.values()):
        assert sum(got.values()) == total


def test_split_replicas_follows_each_share_within_one() -> None:
    shares = {A: 5, B: 3, C: 1}
    for total in range(60):
        got = split_replicas(total, shares)
        assert sum(got.values()) == total
        for t, s in shares.items():
            assert abs(got[t] - total * s / 9) < 1


def test_set_condition_moves_transition_time_only_on_a_flip() -> None:
    t0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(minutes=5)
    conds = set_condition(
        [], "Ready", "False", "Building", "building 2 targets", observed_generation=1, at=t0
    )
    same = set_condition(
        conds, "Ready", "False", "Building", "building 1 target", observed_generation=2, at=t1
    )
    ready = get_condition(same, "Ready")
    assert ready is not None
    assert ready.last_transition_time == t0 and ready.message == "building 1 target"
    assert ready.observed_generation == 2
    flipped = set_condition(same, "Ready", "True", "Ready", at=t1)
    flipped_ready = get_condition(flipped, "Ready")
    assert flipped_ready is not None and flipped_ready.last_transition_time == t1
    both = set_condition(flipped, "Stalled", "False", "NoFailures", at=t1)
    assert [c.type for c in both] == ["Ready", "Stalled"]
    assert get_condition(both, "Degraded") is None
    assert conds[0].status == "False"  # input not modified


def test_status_wire_format() -> None:
    status = TRTEngineStatus(
        observed_generation=3,
        conditions=set_condition([], "Ready", "True", "Ready", at=dt.datetime(2025, 1, 1, 12, 0, 0, 123456)),
        targets=[
            TargetStatus(
                name=H100.name,
                gpu=H100.gpu,
                phase="Ready",
                engine_uri="pvc://store/engines/k",
                size_bytes=10,
                cache_hit=True,
                accuracy={"maxAbsError": 0.001, "passed": True},
            )
        ],
        ready_targets=ready_text(1, 1),
    )
    wire = status.to_wire()
    assert wire["observedGeneration"] == 3
    assert wire["readyTargets"] == "1/1"
    assert wire["conditions"][0]["lastTransitionTime"] == "2025-01-01T12:00:00Z"
    t = wire["targets"][0]
    assert t["engineURI"] == "pvc://store/engines/k" and t["sizeBytes"] == 10 and t["cacheHit"] is True
    assert t["accuracy"] == {"maxAbsError": 0.001, "passed": True}
    assert "mig" not in t
    assert TRTEngineStatus.model_validate(wire) == status.model_copy(
        update={
            "conditions": [
                status.conditions[0].model_copy(
                    update={"last_transition_time": dt.datetime(2025, 1, 1, 12, tzinfo=dt.UTC)}
                )
            ]
        }
    )
    assert status.targets[0].target() == H100


def test_faults_keep_the_last_n() -> None:
    infd = InferenceDeployment.model_validate(
        {"metadata": {"name": "d"}, "spec": {"engineRef": {"name": "e"}}}
    )
    t0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    for i in range(MAX_FAULTS + 5):
        infd.status.add_fault(
            FaultRecord(time=t0 + dt.timedelta(seconds=i), node="n", xid=79, action="PodMoved")
        )
    assert len(infd.status.faults) == MAX_FAULTS
    assert infd.status.faults[-1].time == t0 + dt.timedelta(seconds=MAX_FAULTS + 4)
    wire = infd.status.to_wire()
    assert wire["faults"][0]["xid"] == 79


def test_live_object_with_server_fields_parses() -> None:
    body = yaml.safe_load((ROOT / "examples/trtengine-squeezenet.yaml").read_text())
    body["metadata"].update(
        {
            "namespace": "team-a",
            "uid": "u-1",
            "generation": 2,
            "resourceVersion": "77",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "managedFields": [{"manager": "x"}],
        }
    )
    body["status"] = {"observedGeneration": 1, "readyTargets": "0/2", "someFutureField": 1}
    engine = TRTEngine.model_validate(body)
    assert engine.metadata.generation == 2 and engine.metadata.resource_version == "77"
    assert engine.status.ready_targets == "0/2"
    assert TRTEngine.PLURAL == "trtengines" and InferenceDeployment.SHORT_NAMES == ["infd"]
