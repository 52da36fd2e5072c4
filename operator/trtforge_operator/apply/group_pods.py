"""The native backend's rank pods, pure (docs/llm.md §"Groups"): one pod per rank, made from the
target's runtime Deployment (the same image, store access, probes, security and node selection),
with the rank's own ``serve-llm`` flags, its stable name and hostname under the group's headless
Service, a whole node's GPUs, no restarts (a rank that ends breaks its group, which is recreated
whole) and, where the nodes have one, affinity to one GPU clique."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from trtforge.contract.llm import Parallelism
from trtforge_operator.apply import children
from trtforge_operator.apply.group_rbac import rank_exec_name
from trtforge_operator.apply.llm_children import OPENAI_PORT_NAME
from trtforge_operator.planning.groups import (
    LABEL_GROUP_WHOLE,
    RANK_PORT,
    GroupShape,
    RankIdentity,
    rank_arguments,
)
from trtforge_operator.planning.trtllm_groups import trtllm_rank_arguments

# What a TensorRT-LLM worker fetches and verifies, at the leader's paths (mpirun's ranks load there).
FETCH_FLAGS = ("--store", "--checkpoint", "--tuning", "--cache-dir")

ANNOTATION_GROUP_TEMPLATE = "trtforge.io/group-template"  # what the group runs: a change rolls it


def template_hash(deployment: Mapping[str, Any], gpus: int) -> str:
    """What a group's pods run, from the target's runtime Deployment template (not its replicas)."""
    return children.spec_hash({"template": deployment["spec"]["template"], "gpus": gpus})


def _with_gpus(resources: Mapping[str, Any], resource: str | None, gpus: int) -> dict[str, Any]:
    out = {k: dict(v) for k, v in resources.items()}
    if resource is not None:
        for part in ("limits", "requests"):
            if resource in out.get(part, {}):
                out[part][resource] = str(gpus)
    return out


def _and_clique(affinity: Mapping[str, Any], clique: Mapping[str, Any] | None) -> dict[str, Any]:
    """The template's affinity (nodes to avoid) AND the clique's: the clique's node expression goes
    into every node selector term (terms are ORed), its pod affinity beside."""
    out = copy.deepcopy(dict(affinity))
    if clique is None:
        return out
    want = clique["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    required = out.setdefault("nodeAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {}
    )
    terms = required.get("nodeSelectorTerms") or [{}]
    for t in terms:
        t["matchExpressions"] = [*(t.get("matchExpressions") or []), *want["matchExpressions"]]
    required["nodeSelectorTerms"] = terms
    out["podAffinity"] = copy.deepcopy(clique["podAffinity"])
    return out


def _flag(command: Sequence[str], flag: str) -> list[str]:
    """`flag` and its value as `command` has them (before any ``--``), or nothing."""
    cut = command.index("--") if "--" in command else len(command)
    head = list(command[:cut])
    return [flag, head[head.index(flag) + 1]] if flag in head[:-1] else []


def _worker_command(
    leader_command: Sequence[str], probe_port: int, rank_args: Sequence[str], fetch: bool = False
) -> list[str]:
    """A worker's ``serve-llm``: the leader's server, its own address and probe port, its rank. A
    llama.cpp worker fetches nothing (the leader sends it the tensors over RPC); a TensorRT-LLM one
    (`fetch`) verifies the leader's checkpoint and tuning record into the same cache paths."""
    out = [*leader_command[:2], *_flag(leader_command, "--server")]
    if fetch:
        out += [w for f in FETCH_FLAGS for w in _flag(leader_command, f)]
    return [*out, "--host", "$(POD_IP)", "--probe-port", str(probe_port), *rank_args]


def _rank_exec_identity(spec: dict[str, Any], container: dict[str, Any], group: str) -> None:
    """A TensorRT-LLM leader runs mpirun, whose agent (`trtforge rank-exec`) execs into the workers:
    it runs as its group's own account with a token, and knows its namespace."""
    spec["serviceAccountName"] = rank_exec_name(group)
    spec["automountServiceAccountToken"] = True
    env = [e for e in container.get("env") or () if e.get("name") != "POD_NAMESPACE"]
    env.append({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
    container["env"] = env


def rank_pod(
    deployment: Mapping[str, Any],
    me: RankIdentity,
    group: Sequence[RankIdentity],
    *,
    gpus: int,
    gpu_resource: str | None,
    probe_port: int,
    addresses: Mapping[int, str] | None = None,
    clique: Mapping[str, Any] | None = None,
    lws: bool = False,
    trtllm: Parallelism | None = None,
) -> dict[str, Any]:
    """Rank `me`'s pod, from the target's runtime Deployment manifest. `addresses`: the workers' pod
    IPs (rank -> IP), which the leader is given in place of their DNS names. `lws`: a template of a
    LeaderWorkerSet instead, whose ranks find each other from its LWS_* variables (`--lws`), named,
    placed and restarted by LeaderWorkerSet. `trtllm`: the mapping of a trtllm-serve group (the
    mpirun path): the ranks' flags carry it, workers fetch, and the leader may exec into them."""
    template = deployment["spec"]["template"]
    spec = copy.deepcopy(template["spec"])
    (c,) = spec["containers"]
    command = list(c.get("command") or c.get("args") or [])
    if lws:
        rank_args = ["--lws"] if me.leader else ["--lws", "--rank-port", str(RANK_PORT)]
    elif trtllm is not None:
        shape = GroupShape(len(group), gpus)
        rank_args = trtllm_rank_arguments(me, group, trtllm, shape, addresses, probe_port)
    else:
        rank_args = rank_arguments(me, group, addresses, probe_port)
    if me.leader:
        cut = command.index("--") if "--" in command else len(command)
        command = [*command[:cut], *rank_args, *command[cut:]]
        if trtllm is not None and not lws:
            _rank_exec_identity(spec, c, me.group)
    else:
        command = _worker_command(command, probe_port, rank_args, fetch=trtllm is not None)
        c["ports"] = [p for p in c.get("ports") or () if p.get("name") != OPENAI_PORT_NAME]
        c["ports"].append({"name": "rank", "containerPort": RANK_PORT, "protocol": "TCP"})
    c["command" if "command" in c else "args"] = command
    c["resources"] = _with_gpus(c.get("resources") or {}, gpu_resource, gpus)
    if not lws:
        spec.update(hostname=me.pod, subdomain=me.subdomain, restartPolicy="Never")
    affinity = _and_clique(spec.get("affinity") or {}, clique)
    if affinity:
        spec["affinity"] = affinity
    labels = {**template["metadata"]["labels"], **me.labels()}
    labels.pop(LABEL_GROUP_WHOLE, None)  # the operator sets it once the group is whole
    meta = deployment["metadata"]
    annotations = {
        **(template["metadata"].get("annotations") or {}),
        ANNOTATION_GROUP_TEMPLATE: template_hash(deployment, gpus),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": me.pod,
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": copy.deepcopy(meta["ownerReferences"]),
        },
        "spec": spec,
    }
