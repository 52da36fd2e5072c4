"""Small literal Kubernetes objects for planner tests: GPU Nodes as GFD labels them, Jobs, and the
observed state of an InferenceDeployment pass built from them."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from trtforge_operator.api import InferenceDeployment, TRTEngine
from trtforge_operator.labels import ANNOTATION_RESULT
from trtforge_operator.observe.views import DeploymentObserved, NodeView
from trtforge_operator.planning.autoscaling import AutoscalingApis

from trtforge.contract.gpu import KNOWN_GPUS


def iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_node(
    name: str,
    product: str,
    gpus: int = 1,
    *,
    mig: dict[str, int] | None = None,
    allocatable: dict[str, int] | None = None,
    ready: bool = True,
) -> dict[str, Any]:
    known = KNOWN_GPUS.get(product)
    arch = known.arch if known else "amd64"
    cc = known.compute_capability if known else (9, 0)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/arch": arch,
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.compute.major": str(cc[0]),
        "nvidia.com/gpu.compute.minor": str(cc[1]),
    }
    capacity: dict[str, int] = {}
    if mig:
        labels |= {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config.state": "success"}
        capacity |= {f"nvidia.com/mig-{p}": n for p, n in mig.items()}
    else:
        capacity["nvidia.com/gpu"] = gpus
    alloc = dict(capacity) | (allocatable or {})
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": {k: str(v) for k, v in capacity.items()},
            "allocatable": {k: str(v) for k, v in alloc.items()},
            "conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}],
        },
    }


def cpu_node(name: str = "cpu-0") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/arch": "amd64"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def default_nodes() -> list[dict[str, Any]]:
    """The test bed's default node set."""
    return [
        gpu_node("gpu-h100-0", "NVIDIA-H100-80GB-HBM3", 8),
        gpu_node("gpu-h100-1", "NVIDIA-H100-80GB-HBM3", 8),
        gpu_node("gpu-gh200-0", "NVIDIA-GH200-480GB", 1),
        gpu_node("gpu-b200-mig-0", "NVIDIA-B200", 2, mig={"3g.90gb": 2, "1g.23gb": 8}),
        cpu_node(),
    ]


def job(
    manifest: dict[str, Any],
    *,
    state: str = "running",
    at: float = 0.0,
    result: dict[str, Any] | None = None,
    reason: str = "BackoffLimitExceeded",
) -> dict[str, Any]:
    """A Job as the apiserver shows it once `manifest` was created (state: running|complete|failed)."""
    obj = json.loads(json.dumps(manifest))
    meta = obj["metadata"]
    meta["creationTimestamp"] = iso(at)
    if result is not None:
        meta["annotations"][ANNOTATION_RESULT] = json.dumps(result)
    status: dict[str, Any] = {"startTime": iso(at)}
    if state == "running":
        status["active"] = 1
    elif state == "complete":
        status |= {
            "succeeded": 1,
            "completionTime": iso(at + 10),
            "conditions": [{"type": "Complete", "status": "True"}],
        }
    else:
        status |= {
            "failed": 1,
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": reason,
                    "message": "Job has reached the specified backoff limit",
                    "lastTransitionTime": iso(at + 10),
                }
            ],
        }
    obj["status"] = status
    return obj


def runtime_request(target: Any, engine_key: str, **kw: Any) -> Any:
    """A runtime Deployment's request for team-a's InferenceDeployment `chat` (uid-1) on `target`."""
    from trtforge_operator.apply import children

    return children.RuntimeRequest(
        namespace="team-a",
        infd="chat",
        infd_uid="uid-1",
        target=target,
        engine_key=engine_key,
        engine_sha256="",
        replicas=1,
        node_selector={},
        image="trtforge-runtime",
        image_pull_policy="IfNotPresent",
        **kw,
    )


def deployment_observed(
    d: InferenceDeployment, engine: TRTEngine | None, now: float, **fields: Any
) -> DeploymentObserved:
    """One InferenceDeployment pass's observed state for `d` (its metadata names it; uid and
    generation default to uid-1 and 1): `engine` on the default nodes, nothing of ours yet and no
    autoscaling API. `fields` replace any of DeploymentObserved's fields."""
    meta = d.metadata
    base: dict[str, Any] = {
        "namespace": meta.namespace or "team-a",
        "name": meta.name or "",
        "uid": meta.uid or "uid-1",
        "generation": meta.generation or 1,
        "spec": d.spec,
        "status": d.status,
        "engine": engine,
        "deployments": [],
        "pods": [],
        "nodes": [NodeView.from_k8s(n) for n in default_nodes()],
        "jobs": [],
        "now": now,
        "apis": AutoscalingApis(hpa=None, keda=False),
    }
    return DeploymentObserved(**{**base, **fields})
