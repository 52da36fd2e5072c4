"""What a TensorRT-LLM group's leader may do, pure (docs/llm.md §"TensorRT-LLM ranks: mpirun"): its
own ServiceAccount, a Role with ``pods/exec`` on its group's worker pods by name
(:func:`~trtforge_operator.planning.trtllm_groups.rank_exec_rules`) and the RoleBinding between
them, all owned by the InferenceDeployment. mpirun starts OpenMPI's daemon in each worker through
``trtforge rank-exec`` (``kubectl exec``): no sshd, and no other pod gets a token."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtforge_operator.apply import children
from trtforge_operator.labels import ANNOTATION_SPEC_HASH
from trtforge_operator.planning.groups import LABEL_GROUP, RankIdentity
from trtforge_operator.planning.trtllm_groups import rank_exec_rules

RBAC_API = "rbac.authorization.k8s.io/v1"


def rank_exec_name(group: str) -> str:
    """The leader's ServiceAccount, Role and RoleBinding (one name for the three)."""
    return f"{group}-rank-exec"


def _object(
    api: str, kind: str, group: str, namespace: str, owner: Mapping[str, Any], body: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {
            "name": rank_exec_name(group),
            "namespace": namespace,
            "labels": {LABEL_GROUP: group},
            "annotations": {ANNOTATION_SPEC_HASH: children.spec_hash(dict(body))},
            "ownerReferences": [dict(owner)],
        },
        **body,
    }


def rank_exec_access(
    group: Sequence[RankIdentity], namespace: str, owner: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The leader's ServiceAccount, Role and RoleBinding, in the order they are applied (the account
    before the pod that runs as it). The account mounts no token by default: only the leader's pod
    asks for one (:func:`~trtforge_operator.apply.group_pods.rank_pod`)."""
    name = group[0].group
    sa = rank_exec_name(name)
    return [
        _object("v1", "ServiceAccount", name, namespace, owner, {"automountServiceAccountToken": False}),
        _object(RBAC_API, "Role", name, namespace, owner, {"rules": rank_exec_rules(group)}),
        _object(
            RBAC_API,
            "RoleBinding",
            name,
            namespace,
            owner,
            {
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
            },
        ),
    ]
