"""The native group backend's Services, pure (docs/llm.md §"Groups"): a headless Service per group that
gives every rank its stable DNS name (hostname.subdomain) before it is ready, and the deployment's
leader Service, which selects only the leaders of whole groups."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtforge_operator.planning.groups import (
    LABEL_GROUP,
    LABEL_GROUP_WHOLE,
    LABEL_RANK,
    PROBE_PORT,
    RANK_PORT,
)


def _meta(
    name: str, namespace: str, labels: Mapping[str, str], owner: Mapping[str, Any] | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    return meta


def rank_service(group: str, namespace: str, owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Headless, publishing not-ready pods: the leader must reach a worker's supervisor while the
    worker is still starting, and the workers are never ready for traffic of their own."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(group, namespace, {LABEL_GROUP: group}, owner),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_GROUP: group},
            "ports": [
                {"name": "rank", "port": RANK_PORT, "targetPort": RANK_PORT},
                {"name": "http", "port": PROBE_PORT, "targetPort": PROBE_PORT},
            ],
        },
    }


def leader_selector(deployment_labels: Mapping[str, str]) -> dict[str, str]:
    """The leader Service's selector: the deployment's pods, rank 0, of a whole group (gang rule)."""
    return {**deployment_labels, LABEL_RANK: "0", LABEL_GROUP_WHOLE: "true"}


def leader_service(
    name: str,
    namespace: str,
    deployment_labels: Mapping[str, str],
    ports: Sequence[Mapping[str, Any]],
    owner: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(name, namespace, deployment_labels, owner),
        "spec": {"selector": leader_selector(deployment_labels), "ports": [dict(p) for p in ports]},
    }
