"""Autoscaling decisions: which autoscaler a target gets, in which API, and who sets its replicas. No I/O.

- :func:`hpa_api_version`: from the versions of the ``autoscaling`` group the apiserver serves
  (discovery), the one the operator writes its HorizontalPodAutoscalers in: ``autoscaling/v2``, else
  ``autoscaling/v2beta2`` (Kubernetes before 1.23), else none (the cluster cannot autoscale on a
  custom metric).
- :func:`keda_served`: whether KEDA's ScaledObject (``scaledobjects.keda.sh``, v1alpha1) is served.
- :func:`rediscover`: when the served APIs are looked up again (they change when KEDA is installed or
  the cluster is upgraded): after a TTL, sooner when a pass wants what the last look did not find, and
  at once after a write was refused because the API it used is gone.
- :func:`autoscaler_choice`: the autoscaler of one target: an HPA (``provider: HPA``), a KEDA
  ScaledObject (``provider: KEDA``), or none with a typed reason (nothing is made in its place).
- :func:`replicas_decision`: a target Deployment's replicas. Without an autoscaler the operator owns
  them (the split of ``spec.replicas``); with one the autoscaler does, and the operator writes them
  only when it creates the Deployment (the split clamped to the autoscaler's range). Afterwards it
  keeps whatever the Deployment has, through a rollout too: the Deployment controller adds the surge
  on top, and the autoscaler's number is never reset.
- :func:`keda_query`, :func:`keda_threshold`: a ScaledObject's prometheus trigger.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from trtforge.contract.quantity import parse_quantity
from trtforge_operator.api import Autoscaling, AutoscalingMetric, AutoscalingProvider
from trtforge_operator.observe.views import AutoscalingApis, HpaApi

KEDA_API = "keda.sh/v1alpha1"
SCALED_OBJECTS = "scaledobjects"


class AutoscalerKind(enum.StrEnum):
    """The kinds of autoscaler the operator makes (one per autoscaled target Deployment)."""

    HPA = "HorizontalPodAutoscaler"
    SCALED_OBJECT = "ScaledObject"


class AutoscalingProblem(enum.StrEnum):
    """Why a target asked to autoscale has no autoscaler (the Autoscaling condition's reason)."""

    NO_HPA_API = "NoCustomMetricsHPA"  # neither autoscaling/v2 nor v2beta2 is served
    KEDA_NOT_INSTALLED = "KedaNotInstalled"  # scaledobjects.keda.sh is not served
    KEDA_NO_PROMETHEUS = "KedaPrometheusNotConfigured"  # the operator has no Prometheus address


def hpa_api_version(served: Iterable[str]) -> HpaApi | None:
    """The HPA API to write in, from the group versions served (``autoscaling/v1``, ...); None when
    neither v2 nor v2beta2 is (only ``autoscaling/v1``, which scales on CPU alone)."""
    have = set(served)
    for api in (HpaApi.V2, HpaApi.V2BETA2):
        if api.value in have:
            return api
    return None


def keda_served(resources: Iterable[str]) -> bool:
    """Whether KEDA's ScaledObject is served, from the resources of ``keda.sh/v1alpha1`` (discovery;
    empty when the group version is not served at all)."""
    return SCALED_OBJECTS in set(resources)


class Rediscover(enum.StrEnum):
    """Whether a pass looks the autoscaling APIs up again, and why."""

    NO = "no"
    NEVER_LOOKED = "never-looked"
    EXPIRED = "expired"  # older than the TTL
    MISSING = "missing"  # the pass wants an API the last look did not find
    REFUSED = "refused"  # a write in a cached API was refused with 404 (the API is gone)


def rediscover(
    looked_at: float | None,
    now: float,
    *,
    ttl: float,
    miss_retry: float,
    wants_missing: bool,
    refused: bool = False,
) -> Rediscover:
    """When to look the served autoscaling APIs up again.

    ``looked_at``: when the last successful look was (None: never). ``wants_missing``: the pass wants
    an API the last look did not find (KEDA asked for and not served, or no HPA API): it looks again
    once ``miss_retry`` has passed, so installing KEDA (or upgrading) takes effect without a restart,
    and a cluster without it is not asked on every pass. ``refused``: a write in the cached API came
    back 404: look now."""
    if looked_at is None:
        return Rediscover.NEVER_LOOKED
    if refused:
        return Rediscover.REFUSED
    age = now - looked_at
    if age >= ttl:
        return Rediscover.EXPIRED
    if wants_missing and age >= miss_retry:
        return Rediscover.MISSING
    return Rediscover.NO


def wants_missing(autos: Iterable[Autoscaling | None], apis: AutoscalingApis) -> bool:
    """Whether any of these targets' autoscaling needs an API ``apis`` says is not served."""
    for auto in autos:
        if auto is None:
            continue
        if auto.provider == AutoscalingProvider.KEDA and not apis.keda:
            return True
        if auto.provider == AutoscalingProvider.HPA and apis.hpa is None:
            return True
    return False


@dataclass(frozen=True)
class AutoscalerChoice:
    """The autoscaler of one target: a kind, or none (with why, when one was asked for)."""

    kind: AutoscalerKind | None
    problem: AutoscalingProblem | None = None


def autoscaler_choice(
    auto: Autoscaling | None, apis: AutoscalingApis, keda_prometheus: str | None
) -> AutoscalerChoice:
    """Which autoscaler a target gets. The one asked for or none: a KEDA target on a cluster without
    KEDA gets no HPA in its place (the user asked for KEDA's behaviour; the condition says what is
    missing), and its Deployment keeps the split of ``spec.replicas``."""
    if auto is None:
        return AutoscalerChoice(None)
    if auto.provider == AutoscalingProvider.KEDA:
        if not apis.keda:
            return AutoscalerChoice(None, AutoscalingProblem.KEDA_NOT_INSTALLED)
        if not keda_prometheus:
            return AutoscalerChoice(None, AutoscalingProblem.KEDA_NO_PROMETHEUS)
        return AutoscalerChoice(AutoscalerKind.SCALED_OBJECT)
    if apis.hpa is None:
        return AutoscalerChoice(None, AutoscalingProblem.NO_HPA_API)
    return AutoscalerChoice(AutoscalerKind.HPA)


def problem_message(problem: AutoscalingProblem) -> str:
    """What is missing and what to do, naming the field (the Autoscaling condition's message)."""
    if problem == AutoscalingProblem.KEDA_NOT_INSTALLED:
        return (
            "spec.autoscaling.provider is KEDA, but this cluster does not serve KEDA's ScaledObject "
            f"(scaledobjects.keda.sh, {KEDA_API}): install KEDA, or set provider: HPA; until then no "
            "autoscaler is made and the operator keeps spec.replicas' split"
        )
    if problem == AutoscalingProblem.KEDA_NO_PROMETHEUS:
        return (
            "spec.autoscaling.provider is KEDA, but the operator has no Prometheus address for the "
            "ScaledObject's prometheus trigger: set autoscaling.keda.prometheusServerAddress in the "
            "chart (autoscaling.keda_prometheus_address in the operator's configuration), or set "
            "provider: HPA; until then no autoscaler is made and the operator keeps spec.replicas' split"
        )
    return (
        "autoscaling needs autoscaling/v2 or v2beta2, which this cluster does not serve "
        "(spec.autoscaling.provider HPA): the operator keeps spec.replicas' split"
    )


def clamp(replicas: int, auto: Autoscaling) -> int:
    """``replicas`` within the autoscaler's [minReplicas, maxReplicas]."""
    return max(auto.min_replicas, min(auto.max_replicas, replicas))


@dataclass(frozen=True)
class ReplicasDecision:
    """What the operator writes as a target Deployment's replicas, and who owns them."""

    replicas: int  # what a new Deployment is created with, and what is wanted as far as known
    hpa_owned: bool  # an autoscaler sets them: a replace keeps the Deployment's own number


def replicas_decision(
    split: int, auto: Autoscaling | None, current_spec_replicas: int | None, autoscaler: AutoscalerKind | None
) -> ReplicasDecision:
    """The replicas of one target Deployment.

    ``split`` is the target's share of ``spec.replicas``; ``current_spec_replicas`` the Deployment's
    ``spec.replicas`` as observed (None: no Deployment yet); ``autoscaler`` the kind the target gets
    (:func:`autoscaler_choice`; None: none). Without an autoscaler the split is written. With one, a
    new Deployment starts at the split clamped to the range, and an existing one keeps its count (what
    the autoscaler set).
    """
    if auto is None or autoscaler is None:
        return ReplicasDecision(split, hpa_owned=False)
    if current_spec_replicas is None:
        return ReplicasDecision(clamp(split, auto), hpa_owned=True)
    return ReplicasDecision(current_spec_replicas, hpa_owned=True)


# The runtime's series a KEDA trigger sums over one target's pods (per pod, as the HPA reads them).
_SERIES: dict[AutoscalingMetric, str] = {
    AutoscalingMetric.REQUESTS_IN_FLIGHT: "trtforge_runtime_requests_in_flight",
    AutoscalingMetric.QUEUE_DEPTH: "trtforge_runtime_queue_depth",
    AutoscalingMetric.REQUEST_RATE: "trtforge_runtime_requests_total",
    AutoscalingMetric.KV_CACHE_UTILIZATION: "trtforge_llm_kv_cache_utilization",
}


def keda_query(
    metric: AutoscalingMetric, namespace: str, deployment: str, rate_window: str, pods: str | None = None
) -> str:
    """The PromQL of a ScaledObject's prometheus trigger: the metric summed over the target
    Deployment's pods (``<deployment>-<replicaset hash>-<suffix>``). KEDA hands it to the HPA it makes
    as an external metric with an AverageValue target, which divides it by the pod count: the same
    per-pod average the operator's own HPA holds (the ``namespace`` and ``pod`` labels are the ones
    Prometheus' Kubernetes service discovery adds, as for the prometheus-adapter rules). `pods`: a pod
    name pattern in place of the Deployment's (rank groups: their leaders)."""
    pattern = pods or f"{deployment}-[a-z0-9]+-[a-z0-9]+"
    sel = f'namespace="{namespace}",pod=~"{pattern}"'
    series = _SERIES[metric]
    if metric == AutoscalingMetric.REQUEST_RATE:
        return f"sum(rate({series}{{{sel}}}[{rate_window}]))"
    return f"sum({series}{{{sel}}})"


def keda_threshold(target_value: int | str) -> str:
    """``targetValue`` (a Kubernetes quantity such as 4 or 500m) as the plain decimal KEDA parses."""
    return format(parse_quantity(target_value).normalize(), "f")
