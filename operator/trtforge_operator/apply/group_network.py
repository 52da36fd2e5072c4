"""The NetworkPolicy that keeps a group's rank port to its own pods, pure (docs/llm.md §"Groups").

The rank-to-rank port has no authentication (llama.cpp's RPC server warns never to expose it; MPI's
ports neither): only the pods of the same group may reach it. The supervisor's probe port and the
server's OpenAI port stay open to all, as for a single pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtforge_operator.planning.groups import LABEL_GROUP, RANK_PORT


def policy_name(group: str) -> str:
    return f"{group}-ranks"


def rank_port_policy(
    group: str,
    namespace: str,
    open_ports: Sequence[int],
    rank_port: int = RANK_PORT,
    owner: Mapping[str, Any] | None = None,
    mpi: bool = False,
) -> dict[str, Any]:
    """Ingress to the group's pods: `rank_port` from the group's own pods only, `open_ports` from
    anywhere, nothing else. `mpi` (a trtllm-serve group): every port from the group's own pods,
    since OpenMPI's daemons and NCCL listen on ports they pick at run time."""
    if rank_port in open_ports:
        raise ValueError(f"rank port {rank_port} is also among the open ports {list(open_ports)}")
    meta: dict[str, Any] = {
        "name": policy_name(group),
        "namespace": namespace,
        "labels": {LABEL_GROUP: group},
    }
    if owner is not None:
        meta["ownerReferences"] = [dict(owner)]
    members = {"podSelector": {"matchLabels": {LABEL_GROUP: group}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": {LABEL_GROUP: group}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [members]}
                if mpi
                else {"from": [members], "ports": [{"protocol": "TCP", "port": rank_port}]},
                {"ports": [{"protocol": "TCP", "port": p} for p in sorted(set(open_ports))]},
            ],
        },
    }
