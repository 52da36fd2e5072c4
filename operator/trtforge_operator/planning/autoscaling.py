"""Autoscaling decisions: which HPA API to write, and who sets a target Deployment's replicas. No I/O.

- :func:`hpa_api_version`: from the versions of the ``autoscaling`` group the apiserver serves
  (discovery), the one the operator writes its HorizontalPodAutoscalers in: ``autoscaling/v2``, else
  ``autoscaling/v2beta2`` (Kubernetes before 1.23), else none (the cluster cannot autoscale on a
  custom metric).
- :func:`replicas_decision`: a target Deployment's replicas. Without autoscaling the operator owns
  them (the split of ``spec.replicas``); with autoscaling the HPA does, and the operator writes them
  only when it creates the Deployment (the split clamped to the HPA's range). Afterwards it keeps
  whatever the Deployment has, through a rollout too: the Deployment controller adds the surge on
  top, and the autoscaler's number is never reset.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from trtforge_operator.api import Autoscaling


class HpaApi(enum.StrEnum):
    """The HorizontalPodAutoscaler API versions that can scale on a custom (Pods) metric."""

    V2 = "autoscaling/v2"
    V2BETA2 = "autoscaling/v2beta2"


def hpa_api_version(served: Iterable[str]) -> HpaApi | None:
    """The HPA API to write in, from the group versions served (``autoscaling/v1``, ...); None when
    neither v2 nor v2beta2 is (only ``autoscaling/v1``, which scales on CPU alone)."""
    have = set(served)
    for api in (HpaApi.V2, HpaApi.V2BETA2):
        if api.value in have:
            return api
    return None


def clamp(replicas: int, auto: Autoscaling) -> int:
    """``replicas`` within the autoscaler's [minReplicas, maxReplicas]."""
    return max(auto.min_replicas, min(auto.max_replicas, replicas))


@dataclass(frozen=True)
class ReplicasDecision:
    """What the operator writes as a target Deployment's replicas, and who owns them."""

    replicas: int  # what a new Deployment is created with, and what is wanted as far as known
    hpa_owned: bool  # the HPA sets them: a replace keeps the Deployment's own number


def replicas_decision(
    split: int, auto: Autoscaling | None, current_spec_replicas: int | None, hpa_api: HpaApi | None
) -> ReplicasDecision:
    """The replicas of one target Deployment.

    ``split`` is the target's share of ``spec.replicas``; ``current_spec_replicas`` the Deployment's
    ``spec.replicas`` as observed (None: no Deployment yet). Without autoscaling (or with no HPA API
    to write it in) the split is written. With it, a new Deployment starts at the split clamped to the
    range, and an existing one keeps its count (what the HPA set).
    """
    if auto is None or hpa_api is None:
        return ReplicasDecision(split, hpa_owned=False)
    if current_spec_replicas is None:
        return ReplicasDecision(clamp(split, auto), hpa_owned=True)
    return ReplicasDecision(current_spec_replicas, hpa_owned=True)
