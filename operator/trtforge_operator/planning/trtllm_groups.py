"""What the operator gives a TensorRT-LLM rank group on the mpirun path, pure (docs/llm.md §"Groups"):
each rank's `serve-llm` flags and the one permission the leader needs, `pods/exec` on its own
group's worker pods by name (`trtforge rank-exec` is OpenMPI's launcher; no sshd)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trtforge.contract.llm import Parallelism
from trtforge_operator.planning.groups import PROBE_PORT, GroupShape, RankIdentity, rank_arguments


def trtllm_rank_arguments(
    me: RankIdentity,
    group: Sequence[RankIdentity],
    parallelism: Parallelism,
    shape: GroupShape,
    addresses: Mapping[int, str] | None = None,
    probe_port: int = PROBE_PORT,
) -> list[str]:
    """The group's flags (:func:`rank_arguments`, with `addresses` and `probe_port` as there) plus
    the mapping and each pod's GPUs, which the leader's mpirun line needs and a worker's check
    repeats. ValueError when the shape does not hold the mapping (one MPI process per GPU)."""
    if shape.ranks * shape.gpus_per_rank != parallelism.world_size or len(group) != shape.ranks:
        raise ValueError(
            f"group of {len(group)} pods, shape {shape.ranks} x {shape.gpus_per_rank} GPUs, for mapping "
            f"{parallelism.mapping}: expected {parallelism.world_size} GPUs in {shape.ranks} pods"
        )
    return [
        *rank_arguments(me, group, addresses, probe_port),
        "--tensor-parallel", str(parallelism.tensor),
        "--pipeline-parallel", str(parallelism.pipeline),
        "--gpus-per-rank", str(shape.gpus_per_rank),
    ]  # fmt: skip


def rank_exec_rules(group: Sequence[RankIdentity]) -> list[dict[str, Any]]:
    """The leader's Role rules: create ``pods/exec`` on its group's worker pods, by name, and nothing
    else (a recreated group keeps its names, so the rules do not change)."""
    workers = sorted(i.pod for i in group if not i.leader)
    if not workers:
        return []
    return [{"apiGroups": [""], "resources": ["pods/exec"], "resourceNames": workers, "verbs": ["create"]}]
