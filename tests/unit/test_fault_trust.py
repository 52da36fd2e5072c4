"""Which pods' fault reports the operator believes (issue 63): only its own runtime pods, matched by
uid from the InferenceDeployment to its Deployment, ReplicaSet and pod, and only about a GPU the pod
was given. Labels count for nothing."""

from __future__ import annotations

import json
from typing import Any

from trtforge_operator.observe.views import DeploymentView, NodeView, PodView
from trtforge_operator.planning.fault_trust import (
    Distrust,
    needs_owners,
    operator_deployment_uids,
    split_pods,
)
from trtforge_operator.pod_spec import fingerprint

INFD_UID = "infd-uid"
DEP = DeploymentView.from_k8s(
    {
        "metadata": {
            "name": "resnet-h100",
            "namespace": "team-a",
            "uid": "dep-uid",
            "ownerReferences": [{"kind": "InferenceDeployment", "uid": INFD_UID, "controller": True}],
        }
    }
)
TEMPLATE = {"containers": [{"name": "serve", "image": "runtime:1", "command": ["trtforge", "serve"]}]}
RS_OWNERS = {"rs-uid": ("dep-uid", fingerprint(TEMPLATE)), "tenant-rs": ("tenant-dep", fingerprint(TEMPLATE))}


def pod(
    name: str,
    owner: tuple[str, str] | None,
    gpu: str | None = "GPU-a",
    gpus: list[str] | None = None,
    command: tuple[str, ...] = ("trtforge", "serve"),
) -> PodView:
    msg: dict[str, Any] = {
        "reason": "GPUFault",
        "xid": 79,
        "gpu": gpu,
        "gpus": gpus if gpus is not None else ["GPU-a"],
    }
    refs = [{"kind": owner[0], "uid": owner[1], "controller": True}] if owner else []
    return PodView.from_k8s(
        {
            "metadata": {
                "name": name,
                "uid": f"u-{name}",
                "ownerReferences": refs,
                "labels": {"any": "labels"},
            },
            "spec": {
                "nodeName": "n1",
                "containers": [{"name": "serve", "image": "runtime:1", "command": list(command), "args": []}],
            },
            "status": {
                "containerStatuses": [
                    {"name": "serve", "state": {"terminated": {"exitCode": 86, "message": json.dumps(msg)}}}
                ]
            },
        }
    )


def test_only_the_operators_deployments_count() -> None:
    assert operator_deployment_uids([DEP], INFD_UID, {"resnet-h100"}) == {"dep-uid"}
    assert operator_deployment_uids([DEP], "other-infd", {"resnet-h100"}) == frozenset()
    assert operator_deployment_uids([DEP], INFD_UID, {"resnet-b200"}) == frozenset()


def test_a_fault_counts_only_from_the_operators_pod_about_its_own_gpu() -> None:
    deps = operator_deployment_uids([DEP], INFD_UID, {"resnet-h100"})
    ours = pod("ours", ("ReplicaSet", "rs-uid"))
    forged = [
        pod("no-owner", None),
        pod("tenant-rs", ("ReplicaSet", "tenant-rs")),
        pod("unknown-rs", ("ReplicaSet", "not-listed")),
        pod("a-job", ("Job", "rs-uid")),
        # Adopted by the operator's ReplicaSet (its labels match the selector), but not its template.
        pod("adopted", ("ReplicaSet", "rs-uid"), command=("sh", "-c", "exit 86")),
    ]
    not_its_gpu = pod("other-gpu", ("ReplicaSet", "rs-uid"), gpu="GPU-made-up")
    no_list = pod("no-list", ("ReplicaSet", "rs-uid"), gpus=[])
    believed, ignored = split_pods([ours, *forged, not_its_gpu, no_list], deps, RS_OWNERS)
    assert [p.name for p in believed] == ["ours"]
    why = {i.pod: i.why for i in ignored}
    assert why == {
        **{p.name: Distrust.NOT_OPERATOR_POD for p in forged},
        "other-gpu": Distrust.NOT_ITS_GPU,
        "no-list": Distrust.NOT_ITS_GPU,
    }
    assert "GPU-made-up" in next(i.message for i in ignored if i.pod == "other-gpu")
    # A fault that names no GPU (an exit code alone) from the operator's pod counts.
    assert split_pods([pod("ours", ("ReplicaSet", "rs-uid"), gpu=None)], deps, RS_OWNERS)[0]


def test_owners_are_read_only_when_a_pod_reports_or_sits_on_an_unhealthy_node() -> None:
    quiet = PodView.from_k8s({"metadata": {"name": "q"}, "spec": {"nodeName": "n1"}})
    healthy = NodeView.from_k8s(
        {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    down = NodeView.from_k8s(
        {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    )
    assert not needs_owners([quiet], [healthy])
    assert needs_owners([quiet], [down])
    assert needs_owners([pod("p", None)], [healthy])
