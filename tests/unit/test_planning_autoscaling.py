"""Autoscaling: the HPA API chosen from discovery, one operator-owned HPA per target Deployment, the
scale subresource's status, and an operator that never writes replicas an HPA owns."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError
from trtforge_operator.api import (
    SCALE_TO_ZERO_MESSAGE,
    Autoscaling,
    AutoscalingMetric,
    AutoscalingProvider,
    InferenceDeploymentSpec,
    get_condition,
)
from trtforge_operator.apply import children
from trtforge_operator.config import AutoscalingSettings
from trtforge_operator.labels import ANNOTATION_ENGINE_SHA256, ANNOTATION_SPEC_HASH, LABEL_TARGET
from trtforge_operator.observe.views import AutoscalerView
from trtforge_operator.planning.autoscaling import (
    AutoscalerChoice,
    AutoscalerKind,
    AutoscalingApis,
    AutoscalingProblem,
    HpaApi,
    Rediscover,
    autoscaler_choice,
    clamp,
    hpa_api_version,
    keda_query,
    keda_served,
    keda_threshold,
    rediscover,
    replicas_decision,
    wants_missing,
)
from trtforge_operator.planning.deployment import AutoscalerRef, plan_deployment

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
    hpa, so = AutoscalerKind.HPA, AutoscalerKind.SCALED_OBJECT
    assert replicas_decision(3, None, 7, hpa).replicas == 3
    assert not replicas_decision(3, None, 7, hpa).hpa_owned
    # a new Deployment starts within the range
    assert replicas_decision(1, auto, None, hpa).replicas == 2
    assert replicas_decision(9, auto, None, so).replicas == 5
    # an existing one keeps what the autoscaler set, in or out of the range (it moves it back itself)
    assert replicas_decision(1, auto, 4, hpa) == replicas_decision(3, auto, 4, so)
    assert replicas_decision(1, auto, 4, hpa).replicas == 4
    assert replicas_decision(1, auto, 4, so).hpa_owned
    # no autoscaler (no HPA API, KEDA missing): the operator keeps the count itself
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
        AutoscalingMetric.KV_CACHE_UTILIZATION: "trtforge_llm_kv_cache_utilization",
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
    assert plan.delete_autoscalers == [AutoscalerRef(AutoscalerKind.HPA, hpa["metadata"]["name"])]
    assert plan.apply_autoscalers == []
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


# ------------------------------------------------------------------------------------------- KEDA

PROM = "http://prometheus.monitoring.svc:9090"
KEDA_CFG = CFG.model_copy(update={"autoscaling": AutoscalingSettings(keda_prometheus_address=PROM)})
KEDA = {**AUTO, "provider": "KEDA"}


@pytest.mark.parametrize(
    ("provider", "apis", "prometheus", "expected"),
    [
        (None, AutoscalingApis(HpaApi.V2, keda=True), PROM, AutoscalerChoice(None)),
        ("HPA", AutoscalingApis(HpaApi.V2, keda=True), PROM, AutoscalerChoice(AutoscalerKind.HPA)),
        ("HPA", AutoscalingApis(HpaApi.V2BETA2), None, AutoscalerChoice(AutoscalerKind.HPA)),
        (
            "HPA",
            AutoscalingApis(None, keda=True),
            PROM,
            AutoscalerChoice(None, AutoscalingProblem.NO_HPA_API),
        ),
        ("KEDA", AutoscalingApis(None, keda=True), PROM, AutoscalerChoice(AutoscalerKind.SCALED_OBJECT)),
        # asked for KEDA without it: no HPA in its place
        (
            "KEDA",
            AutoscalingApis(HpaApi.V2),
            PROM,
            AutoscalerChoice(None, AutoscalingProblem.KEDA_NOT_INSTALLED),
        ),
        (
            "KEDA",
            AutoscalingApis(HpaApi.V2, keda=True),
            None,
            AutoscalerChoice(None, AutoscalingProblem.KEDA_NO_PROMETHEUS),
        ),
    ],
)
def test_autoscaler_choice(
    provider: str | None, apis: AutoscalingApis, prometheus: str | None, expected: AutoscalerChoice
) -> None:
    auto = None if provider is None else Autoscaling.model_validate({**AUTO, "provider": provider})
    assert autoscaler_choice(auto, apis, prometheus) == expected


def test_provider_defaults_to_hpa_and_refuses_others_naming_the_choices() -> None:
    assert Autoscaling.model_validate(AUTO).provider == AutoscalingProvider.HPA
    with pytest.raises(ValidationError, match="'HPA' or 'KEDA'"):
        Autoscaling.model_validate({**AUTO, "provider": "Knative"})


@pytest.mark.parametrize(
    ("metric", "query"),
    [
        (
            AutoscalingMetric.REQUESTS_IN_FLIGHT,
            'sum(trtforge_runtime_requests_in_flight{namespace="ns",pod=~"x-h100-[a-z0-9]+-[a-z0-9]+"})',
        ),
        (
            AutoscalingMetric.QUEUE_DEPTH,
            'sum(trtforge_runtime_queue_depth{namespace="ns",pod=~"x-h100-[a-z0-9]+-[a-z0-9]+"})',
        ),
        (
            AutoscalingMetric.REQUEST_RATE,
            'sum(rate(trtforge_runtime_requests_total{namespace="ns",pod=~"x-h100-[a-z0-9]+-[a-z0-9]+"}[2m]))',
        ),
    ],
)
def test_keda_query_sums_the_target_deployments_pods(metric: AutoscalingMetric, query: str) -> None:
    assert keda_query(metric, "ns", "x-h100", "2m") == query


def test_keda_query_pod_pattern_takes_only_that_deployments_pods() -> None:
    import re

    q = keda_query(AutoscalingMetric.QUEUE_DEPTH, "ns", "x-h100", "1m")
    pattern = re.search(r'pod=~"([^"]+)"', q).group(1)  # type: ignore[union-attr]
    assert re.fullmatch(pattern, "x-h100-5d8f7c9b4-abcde")
    assert not re.fullmatch(pattern, "x-h100-mig-1g-5d8f7c9b4-abcde")  # another target's Deployment
    assert not re.fullmatch(pattern, "x-h1-5d8f7c9b4-abcde")


@pytest.mark.parametrize(
    ("value", "text"), [(4, "4"), ("4", "4"), ("500m", "0.5"), ("1k", "1000"), ("2.50", "2.5")]
)
def test_keda_threshold_is_a_plain_decimal(value: int | str, text: str) -> None:
    assert keda_threshold(value) == text


def test_keda_gives_one_scaled_object_per_target_deployment_and_no_hpa() -> None:
    d = infd(replicas=2, autoscaling=KEDA)
    plan = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2, keda=True), KEDA_CFG)
    deps = {o["metadata"]["name"]: o for o in _deps(plan)}
    assert len(deps) == 2 and len(plan.apply_autoscalers) == 2
    for so in plan.apply_autoscalers:
        assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
        name = so["metadata"]["name"]
        assert so["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        assert name in deps
        assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 4)
        (trigger,) = so["spec"]["triggers"]
        assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
        assert trigger["metadata"] == {
            "serverAddress": PROM,
            "query": keda_query(AutoscalingMetric.REQUESTS_IN_FLIGHT, "team-a", name, "1m"),
            "threshold": "4",
        }
        (owner,) = so["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("InferenceDeployment", "uid-1", True)
    assert plan.hpa_owned == set(deps)
    cond = get_condition(plan.status.conditions, "Autoscaling")
    assert cond is not None and (cond.status, cond.reason) == ("True", "AutoscalersInPlace")
    assert {t.autoscaler_kind for t in plan.status.targets} == {"ScaledObject"}


def test_switching_provider_deletes_the_other_autoscaler() -> None:
    one = [{"gpu": H100.gpu}]
    hpa_plan = plan_deployment(
        observed(infd(autoscaling=AUTO, targets=one), engine(), hpa_api=HpaApi.V2, keda=True), KEDA_CFG
    )
    (dep,) = _deps(hpa_plan)
    (hpa,) = hpa_plan.apply_autoscalers
    live_dep = _scaled(dep, 3)
    to_keda = plan_deployment(
        observed(
            infd(autoscaling=KEDA, targets=one),
            engine(),
            deployments=[live_dep],
            autoscalers=[_hpa_view(hpa)],
            hpa_api=HpaApi.V2,
            keda=True,
        ),
        KEDA_CFG,
    )
    (so,) = to_keda.apply_autoscalers
    assert so["kind"] == "ScaledObject" and so["metadata"]["name"] == hpa["metadata"]["name"]
    assert to_keda.delete_autoscalers == [AutoscalerRef(AutoscalerKind.HPA, hpa["metadata"]["name"])]
    assert _deps(to_keda) == []  # the count the HPA set stays (the ScaledObject takes over from it)
    # and back: the ScaledObject goes, an HPA comes
    back = plan_deployment(
        observed(
            infd(autoscaling=AUTO, targets=one),
            engine(),
            deployments=[live_dep],
            autoscalers=[_hpa_view(so)],
            hpa_api=HpaApi.V2,
            keda=True,
        ),
        KEDA_CFG,
    )
    (new,) = back.apply_autoscalers
    assert new["kind"] == "HorizontalPodAutoscaler"
    assert back.delete_autoscalers == [AutoscalerRef(AutoscalerKind.SCALED_OBJECT, so["metadata"]["name"])]


def test_the_hpa_keda_makes_for_a_scaled_object_is_not_the_operators() -> None:
    """KEDA copies its ScaledObject's labels (ours) onto the HPA it makes, owned by the ScaledObject."""
    one = [{"gpu": H100.gpu}]
    d = infd(autoscaling=KEDA, targets=one)
    first = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2, keda=True), KEDA_CFG)
    (dep,) = _deps(first)
    (so,) = first.apply_autoscalers
    kedas_hpa = json.loads(json.dumps(so))
    kedas_hpa.update(apiVersion="autoscaling/v2", kind="HorizontalPodAutoscaler")
    kedas_hpa["metadata"]["name"] = "keda-hpa-" + so["metadata"]["name"]
    kedas_hpa["metadata"]["ownerReferences"] = [{"kind": "ScaledObject", "name": "x", "controller": True}]
    plan = plan_deployment(
        observed(
            d,
            engine(),
            deployments=[live(dep)],
            autoscalers=[_hpa_view(so), _hpa_view(kedas_hpa)],
            hpa_api=HpaApi.V2,
            keda=True,
        ),
        KEDA_CFG,
    )
    assert plan.delete_autoscalers == [] and plan.apply_autoscalers == []


@pytest.mark.parametrize(
    ("keda", "cfg", "reason", "missing"),
    [
        (False, KEDA_CFG, AutoscalingProblem.KEDA_NOT_INSTALLED, "scaledobjects.keda.sh"),
        (True, CFG, AutoscalingProblem.KEDA_NO_PROMETHEUS, "autoscaling.keda.prometheusServerAddress"),
    ],
)
def test_keda_asked_for_but_unavailable_says_what_is_missing_and_makes_no_hpa(
    keda: bool, cfg: Any, reason: AutoscalingProblem, missing: str
) -> None:
    d = infd(replicas=2, autoscaling=KEDA, targets=[{"gpu": H100.gpu}])
    plan = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2, keda=keda), cfg)
    assert plan.apply_autoscalers == [] and plan.hpa_owned == set()
    (dep,) = _deps(plan)
    assert dep["spec"]["replicas"] == 2  # the operator keeps spec.replicas' split
    cond = get_condition(plan.status.conditions, "Autoscaling")
    assert cond is not None and (cond.status, cond.reason) == ("False", reason.value)
    assert "spec.autoscaling.provider" in cond.message and missing in cond.message
    assert "provider: HPA" in cond.message  # what to do instead


def test_no_autoscaling_no_autoscaling_condition() -> None:
    d = infd(replicas=2)
    plan = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2), CFG)
    assert get_condition(plan.status.conditions, "Autoscaling") is None


# -------------------------------------------------------------------------------------- discovery


@pytest.mark.parametrize(
    ("looked_at", "now", "wants_missing", "refused", "expected"),
    [
        (None, 100.0, False, False, Rediscover.NEVER_LOOKED),
        (100.0, 150.0, False, False, Rediscover.NO),  # within the TTL, nothing missing
        (100.0, 400.0, False, False, Rediscover.EXPIRED),  # TTL 300
        (100.0, 105.0, True, False, Rediscover.NO),  # missing, but looked 5 s ago (retry after 10)
        (100.0, 110.0, True, False, Rediscover.MISSING),
        (100.0, 101.0, False, True, Rediscover.REFUSED),  # a write in the kept API got 404
    ],
)
def test_rediscover(
    looked_at: float | None, now: float, wants_missing: bool, refused: bool, expected: Rediscover
) -> None:
    assert (
        rediscover(looked_at, now, ttl=300.0, miss_retry=10.0, wants_missing=wants_missing, refused=refused)
        == expected
    )


@pytest.mark.parametrize(
    ("autos", "apis", "expected"),
    [
        ([None], AutoscalingApis(), False),
        ([AUTO], AutoscalingApis(HpaApi.V2), False),
        ([AUTO], AutoscalingApis(None, keda=True), True),
        ([KEDA], AutoscalingApis(HpaApi.V2), True),
        ([KEDA, None], AutoscalingApis(HpaApi.V2, keda=True), False),
    ],
)
def test_wants_missing(autos: list[Any], apis: AutoscalingApis, expected: bool) -> None:
    parsed = [None if a is None else Autoscaling.model_validate(a) for a in autos]
    assert wants_missing(parsed, apis) is expected


@pytest.mark.parametrize(
    ("resources", "served"), [(["scaledobjects", "scaledjobs"], True), (["scaledjobs"], False), ([], False)]
)
def test_keda_served(resources: list[str], served: bool) -> None:
    assert keda_served(resources) is served


# ---------------------------------------------------------------------------------- a share of 0


def test_a_target_with_share_0_has_no_pods_and_no_autoscaler_under_autoscaling() -> None:
    """Weight 0 serves nothing, autoscaling or not: a target held dark gets neither pods nor an HPA
    (minReplicas would otherwise start it)."""
    mig = {"gpu": MIG.gpu, "mig": MIG.mig}
    d = infd(replicas=2, autoscaling=AUTO, targets=[{"gpu": H100.gpu}, {**mig, "replicas": 0}])
    plan = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2), CFG)
    deps = {o["metadata"]["labels"][LABEL_TARGET]: o for o in _deps(plan)}
    h100, dark = deps[H100.name], deps[MIG.name]
    assert dark["spec"]["replicas"] == 0 and dark["metadata"]["name"] not in plan.hpa_owned
    (hpa,) = plan.apply_autoscalers
    assert hpa["spec"]["scaleTargetRef"]["name"] == h100["metadata"]["name"]
    assert h100["spec"]["replicas"] == 2 and h100["metadata"]["name"] in plan.hpa_owned
    by = {t.name: t for t in plan.status.targets}
    assert by[MIG.name].autoscaler is None and by[MIG.name].replicas == 0

    # a target that had an HPA and is set to 0: the HPA goes and its pods go to 0
    before = infd(replicas=2, autoscaling=AUTO, targets=[{"gpu": H100.gpu}, mig])
    first = plan_deployment(observed(before, engine(), hpa_api=HpaApi.V2), CFG)
    live_deps = [_scaled(o, 2) for o in _deps(first)]
    hpas = [_hpa_view(h) for h in first.apply_autoscalers]
    assert len(hpas) == 2
    plan = plan_deployment(
        observed(d, engine(), deployments=live_deps, autoscalers=hpas, hpa_api=HpaApi.V2), CFG
    )
    dark_name = children.deployment_name("resnet", MIG)
    assert plan.delete_autoscalers == [AutoscalerRef(AutoscalerKind.HPA, dark_name)]
    (dep,) = _deps(plan)
    assert dep["metadata"]["name"] == dark_name and dep["spec"]["replicas"] == 0


def test_share_0_alone_asks_for_no_autoscaling() -> None:
    d = infd(replicas=0, autoscaling=AUTO, targets=[{"gpu": H100.gpu, "replicas": 0}])
    plan = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2), CFG)
    assert plan.apply_autoscalers == [] and get_condition(plan.status.conditions, "Autoscaling") is None


def test_a_scaled_object_is_written_again_only_when_it_changes() -> None:
    one = [{"gpu": H100.gpu}]
    d = infd(autoscaling=KEDA, targets=one)
    first = plan_deployment(observed(d, engine(), hpa_api=HpaApi.V2, keda=True), KEDA_CFG)
    (dep,) = _deps(first)
    (so,) = first.apply_autoscalers
    same = plan_deployment(
        observed(
            d, engine(), deployments=[live(dep)], autoscalers=[_hpa_view(so)], hpa_api=HpaApi.V2, keda=True
        ),
        KEDA_CFG,
    )
    assert same.apply_autoscalers == [] and same.delete_autoscalers == []
    for change, cfg in (
        ({**KEDA, "maxReplicas": 8}, KEDA_CFG),
        ({**KEDA, "metric": "RequestRate"}, KEDA_CFG),
        (
            KEDA,
            CFG.model_copy(update={"autoscaling": AutoscalingSettings(keda_prometheus_address=PROM + "0")}),
        ),
    ):
        plan = plan_deployment(
            observed(
                infd(autoscaling=change, targets=one),
                engine(),
                deployments=[live(dep)],
                autoscalers=[_hpa_view(so)],
                hpa_api=HpaApi.V2,
                keda=True,
            ),
            cfg,
        )
        (new,) = plan.apply_autoscalers
        assert new["kind"] == "ScaledObject" and new["spec"] != so["spec"] and plan.delete_autoscalers == []
