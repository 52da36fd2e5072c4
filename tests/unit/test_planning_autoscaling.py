"""Autoscaling: the HPA API chosen from discovery, one operator-owned HPA per target Deployment, the
scale subresource's status, and an operator that never writes replicas an HPA owns."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from trtforge_operator import children
from trtforge_operator.api import (
    SCALE_TO_ZERO_MESSAGE,
    Autoscaling,
    AutoscalingMetric,
    InferenceDeploymentSpec,
    get_condition,
)
from trtforge_operator.labels import ANNOTATION_ENGINE_SHA256, ANNOTATION_SPEC_HASH, LABEL_TARGET
from trtforge_operator.observed import AutoscalerView
from trtforge_operator.planning.autoscaling import HpaApi, clamp, hpa_api_version, replicas_decision
from trtforge_operator.planning.deployment import plan_deployment

from tests.unit.test_planning_deployment import CFG, H100, MIG, engine, infd, live, observed

AUTO = {"minReplicas": 1, "maxReplicas": 4, "metric": "RequestsInFlight", "targetValue": 4}


# ------------------------------------------------------------------------------------ HPA API choice


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (["autoscaling/v1", "autoscaling/v2beta1", "autoscaling/v2beta2"], HpaApi.V2BETA2),  # 1.20
        (["autoscaling/v2", "autoscaling/v1", "autoscaling/v2beta2"], HpaApi.V2),  # 1.23 - 1.25
        (["autoscaling/v2", "autoscaling/v1"], HpaApi.V2),  # 1.26+
        (["autoscaling/v1"], None),
        (["autoscaling/v1", "autoscaling/v2beta1"], None),  # v2beta1 has no AverageValue Pods target
        ([], None),
    ],
)
def test_hpa_api_from_discovery(served: list[str], expected: HpaApi | None) -> None:
    assert hpa_api_version(served) == expected


# ------------------------------------------------------------------------------------- the models


def test_autoscaling_refuses_bad_input_with_a_clear_message() -> None:
    with pytest.raises(
        ValidationError, match="minReplicas \\(5\\) must not be greater than maxReplicas \\(2\\)"
    ):
        Autoscaling.model_validate({**AUTO, "minReplicas": 5, "maxReplicas": 2})
    with pytest.raises(ValidationError, match="scale to zero is not supported") as e:
        Autoscaling.model_validate({**AUTO, "minReplicas": 0})
    assert "hold the first request" in str(e.value)
    with pytest.raises(ValidationError, match="RequestsInFlight"):
        Autoscaling.model_validate({**AUTO, "metric": "GPUUtilization"})
    with pytest.raises(ValidationError, match="targetValue must be greater than 0"):
        Autoscaling.model_validate({**AUTO, "targetValue": "0"})
    with pytest.raises(ValidationError, match="maxReplicas"):
        Autoscaling.model_validate({"targetValue": 4})
    ok = Autoscaling.model_validate({"maxReplicas": 3, "targetValue": "500m"})
    assert (ok.min_replicas, ok.metric) == (1, AutoscalingMetric.REQUESTS_IN_FLIGHT)


def test_a_targets_own_autoscaling_wins_over_the_specs() -> None:
    spec = InferenceDeploymentSpec.model_validate(
        {
            "engineRef": {"name": "e"},
            "autoscaling": AUTO,
            "targets": [
                {"gpu": H100.gpu, "autoscaling": {**AUTO, "maxReplicas": 9, "metric": "QueueDepth"}},
                {"gpu": MIG.gpu, "mig": MIG.mig},
            ],
        }
    )
    by = spec.autoscaling_by_target([H100, MIG])
    assert by[H100] is not None and (by[H100].max_replicas, by[H100].metric) == (9, "QueueDepth")
    assert by[MIG] == spec.autoscaling
    assert InferenceDeploymentSpec.model_validate({"engineRef": {"name": "e"}}).autoscaling_by_target(
        [H100]
    ) == {H100: None}


def test_scale_to_zero_message_says_why() -> None:
    assert "hold the first request" in SCALE_TO_ZERO_MESSAGE and "not supported" in SCALE_TO_ZERO_MESSAGE


# -------------------------------------------------------------------------------- replicas decision


def test_replicas_decision() -> None:
    auto = Autoscaling.model_validate({**AUTO, "minReplicas": 2, "maxReplicas": 5})
    # no autoscaling: the split is written, whatever the Deployment has
    assert replicas_decision(3, None, 7, HpaApi.V2).replicas == 3
    assert not replicas_decision(3, None, 7, HpaApi.V2).hpa_owned
    # a new Deployment starts within the range
    assert replicas_decision(1, auto, None, HpaApi.V2).replicas == 2
    assert replicas_decision(9, auto, None, HpaApi.V2).replicas == 5
    # an existing one keeps what the HPA set, in or out of the range (the HPA moves it back itself)
    assert replicas_decision(1, auto, 4, HpaApi.V2) == replicas_decision(3, auto, 4, HpaApi.V2BETA2)
    assert replicas_decision(1, auto, 4, HpaApi.V2).replicas == 4
    assert replicas_decision(1, auto, 4, HpaApi.V2).hpa_owned
    # no HPA API to write in: the operator keeps the count itself
    assert replicas_decision(3, auto, 4, None).replicas == 3
    assert clamp(0, auto) == 2 and clamp(3, auto) == 3 and clamp(8, auto) == 5


# ------------------------------------------------------------------------------------- the planner


def _deps(plan: Any) -> list[dict[str, Any]]:
    return [o for o in plan.apply if o["kind"] == "Deployment"]


def _hpa_view(hpa: dict[str, Any]) -> AutoscalerView:
    return AutoscalerView.from_k8s(hpa)


def test_one_owned_hpa_per_target_deployment() -> None:
    d = infd(replicas=2, autoscaling=AUTO)
    plan = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2BETA2), CFG)
    deps = {o["metadata"]["name"]: o for o in _deps(plan)}
    assert len(deps) == 2 and len(plan.apply_autoscalers) == 2
    for hpa in plan.apply_autoscalers:
        assert hpa["apiVersion"] == "autoscaling/v2beta2" and hpa["kind"] == "HorizontalPodAutoscaler"
        ref = hpa["spec"]["scaleTargetRef"]
        assert ref == {"apiVersion": "apps/v1", "kind": "Deployment", "name": hpa["metadata"]["name"]}
        assert ref["name"] in deps
        assert (
            hpa["metadata"]["labels"][LABEL_TARGET] == deps[ref["name"]]["metadata"]["labels"][LABEL_TARGET]
        )
        (owner,) = hpa["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
            "InferenceDeployment",
            "resnet",
            "uid-1",
            True,
        )
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
        assert hpa["spec"]["metrics"] == [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "trtforge_runtime_requests_in_flight"},
                    "target": {"type": "AverageValue", "averageValue": "4"},
                },
            }
        ]
    assert plan.hpa_owned == set(deps)
    # the split of spec.replicas (1 each), clamped to [1, 4]
    assert {d["spec"]["replicas"] for d in deps.values()} == {1}
    # in v2 where served: the same shape
    v2 = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2), CFG)
    assert {h["apiVersion"] for h in v2.apply_autoscalers} == {"autoscaling/v2"}


def test_each_metric_has_its_custom_metrics_name() -> None:
    names = {}
    for metric in AutoscalingMetric:
        d = infd(autoscaling={**AUTO, "metric": metric.value}, targets=[{"gpu": H100.gpu}])
        (hpa,) = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2), CFG).apply_autoscalers
        names[metric] = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert names == {
        AutoscalingMetric.REQUESTS_IN_FLIGHT: "trtforge_runtime_requests_in_flight",
        AutoscalingMetric.QUEUE_DEPTH: "trtforge_runtime_queue_depth",
        AutoscalingMetric.REQUEST_RATE: "trtforge_runtime_requests_per_second",
    }


def _scaled(dep: dict[str, Any], n: int) -> dict[str, Any]:
    """`dep` after its HPA set its replicas to `n` (the spec hash annotation is the operator's)."""
    d = live(dep)
    d["spec"]["replicas"] = n
    d["status"].update(replicas=n, updatedReplicas=n, readyReplicas=n, availableReplicas=n)
    return d


def test_the_operator_never_writes_replicas_the_hpa_set() -> None:
    d = infd(replicas=1, autoscaling=AUTO, targets=[{"gpu": H100.gpu}])
    first = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2BETA2), CFG)
    (dep,) = _deps(first)
    (hpa,) = first.apply_autoscalers
    live_dep = _scaled(dep, 3)  # the HPA scaled it to 3
    again = plan_deployment(
        observed(d, engine(), deployments=[live_dep], autoscalers=[_hpa_view(hpa)], hpa_api=HpaApi.V2BETA2),
        CFG,
    )
    assert _deps(again) == [] and again.apply_autoscalers == []  # nothing to write
    (st,) = again.status.targets
    assert (st.replicas, st.current_replicas, st.autoscaler) == (3, 3, hpa["metadata"]["name"])
    assert (again.status.desired_replicas, again.status.replicas, again.status.ready) == (3, 3, "3/3")
    # spec.replicas changes (kubectl scale on the InferenceDeployment): still nothing written
    d5 = infd(replicas=5, autoscaling=AUTO, targets=[{"gpu": H100.gpu}])
    assert (
        _deps(plan_deployment(observed(d5, engine(), deployments=[live_dep], hpa_api=HpaApi.V2BETA2), CFG))
        == []
    )


def test_a_rollout_during_autoscaling_keeps_the_count() -> None:
    d = infd(replicas=1, autoscaling=AUTO, targets=[{"gpu": H100.gpu}])
    (dep,) = _deps(plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2BETA2), CFG))
    live_dep = _scaled(dep, 3)
    plan = plan_deployment(
        observed(d, engine(sha_h="c" * 64), deployments=[live_dep], hpa_api=HpaApi.V2BETA2), CFG
    )
    (new,) = _deps(plan)
    assert new["spec"]["template"]["metadata"]["annotations"][ANNOTATION_ENGINE_SHA256] == "c" * 64
    assert new["spec"]["replicas"] == 3  # the HPA's count, not spec.replicas (1)
    assert new["metadata"]["name"] in plan.hpa_owned  # and the replace keeps the live count (kube.py)
    assert get_condition(plan.status.conditions, "Progressing").status == "True"  # type: ignore[union-attr]


def test_replicas_are_out_of_the_hash_only_when_an_hpa_owns_them() -> None:
    def dep(replicas: int, owned: bool) -> dict[str, Any]:
        req = children.RuntimeRequest(
            namespace="ns",
            infd="x",
            infd_uid="u",
            target=H100,
            engine_key="k" * 64,
            engine_sha256="s" * 64,
            replicas=replicas,
            node_selector={},
            image="img",
            image_pull_policy="IfNotPresent",
            hpa_owned=owned,
        )
        return children.runtime_deployment(req, CFG)

    def h(replicas: int, owned: bool) -> str:
        return str(dep(replicas, owned)["metadata"]["annotations"][ANNOTATION_SPEC_HASH])

    assert h(1, True) == h(5, True)
    assert h(1, False) != h(5, False)
    assert dep(5, True)["spec"]["replicas"] == 5  # a new Deployment is still created with a count


def test_turning_autoscaling_off_deletes_the_hpa_and_the_operator_sets_replicas_again() -> None:
    on = infd(replicas=2, autoscaling=AUTO, targets=[{"gpu": H100.gpu}])
    first = plan_deployment(observed(on, engine(), hpa_api=HpaApi.V2), CFG)
    (dep,) = _deps(first)
    (hpa,) = first.apply_autoscalers
    live_dep = _scaled(dep, 4)
    off = infd(replicas=2, targets=[{"gpu": H100.gpu}])
    plan = plan_deployment(
        observed(off, engine(), deployments=[live_dep], autoscalers=[_hpa_view(hpa)], hpa_api=HpaApi.V2), CFG
    )
    assert plan.delete_autoscalers == [hpa["metadata"]["name"]] and plan.apply_autoscalers == []
    (new,) = _deps(plan)
    assert new["spec"]["replicas"] == 2 and plan.hpa_owned == set()


def test_a_changed_autoscaling_spec_replaces_the_hpa() -> None:
    d = infd(autoscaling=AUTO, targets=[{"gpu": H100.gpu}])
    first = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2), CFG)
    (dep,) = _deps(first)
    (hpa,) = first.apply_autoscalers
    d2 = infd(autoscaling={**AUTO, "maxReplicas": 8}, targets=[{"gpu": H100.gpu}])
    plan = plan_deployment(
        observed(d2, engine(), deployments=[live(dep)], autoscalers=[_hpa_view(hpa)], hpa_api=HpaApi.V2), CFG
    )
    (new,) = plan.apply_autoscalers
    assert new["spec"]["maxReplicas"] == 8 and plan.delete_autoscalers == []


def test_without_an_hpa_api_the_operator_keeps_a_fixed_count() -> None:
    d = infd(replicas=2, autoscaling=AUTO, targets=[{"gpu": H100.gpu}])
    plan = plan_deployment(observed(d, engine(), hpa_api=None), CFG)
    (dep,) = _deps(plan)
    assert plan.apply_autoscalers == [] and dep["spec"]["replicas"] == 2 and plan.hpa_owned == set()
    (st,) = plan.status.targets
    assert st.message is not None and "autoscaling needs autoscaling/v2 or v2beta2" in st.message


def test_scale_subresource_status() -> None:
    d = infd(replicas=3)
    first = plan_deployment(observed(d, engine()), CFG)
    assert first.status.desired_replicas == 3 and first.status.replicas == 0  # no pods yet
    assert first.status.selector == "app.kubernetes.io/name=trtforge,trtforge.io/inferencedeployment=resnet"
    sel = dict(kv.split("=") for kv in (first.status.selector or "").split(","))
    for dep in _deps(first):
        assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    deps = [live(o) for o in _deps(first)]
    assert sorted(o["spec"]["replicas"] for o in deps) == [1, 2]  # 3 split over 2 targets
    plan = plan_deployment(observed(d, engine(), deployments=deps), CFG)
    assert (plan.status.replicas, plan.status.desired_replicas, plan.status.ready) == (3, 3, "3/3")
    wire = json.loads(json.dumps(plan.status.to_wire()))
    assert wire["desiredReplicas"] == 3 and wire["selector"] == first.status.selector
