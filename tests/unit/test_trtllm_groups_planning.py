"""The operator's side of a TensorRT-LLM group on the mpirun path (planning/trtllm_groups.py): each
rank's flags carry the mapping, and the leader may exec into its own worker pods only."""

from __future__ import annotations

import pytest
from trtforge_operator.planning.groups import group_shape, rank_identities
from trtforge_operator.planning.trtllm_groups import rank_exec_rules, trtllm_rank_arguments

from trtforge.contract.llm import Parallelism


def test_each_rank_gets_the_mapping_and_its_pods_gpus() -> None:
    par = Parallelism(tensor=8, pipeline=2)
    shape = group_shape(8, 2, gpus_per_node=8)
    ids = rank_identities("chat", 0, shape)
    leader = trtllm_rank_arguments(ids[0], ids, par, shape)
    assert leader[:4] == ["--world-size", "2", "--worker", "chat-g0-1.chat-g0:50052:8000"]
    assert leader[4:] == ["--tensor-parallel", "8", "--pipeline-parallel", "2", "--gpus-per-rank", "8"]
    worker = trtllm_rank_arguments(ids[1], ids, par, shape)
    assert worker[:2] == ["--rank", "1"] and worker[-2:] == ["--gpus-per-rank", "8"]
    with pytest.raises(ValueError, match="tp4pp1"):
        trtllm_rank_arguments(ids[0], ids, Parallelism(tensor=4), shape)


def test_the_leader_may_exec_into_its_own_worker_pods_only() -> None:
    ids = rank_identities("chat", 3, group_shape(16, 1, gpus_per_node=4))
    (rule,) = rank_exec_rules(ids)
    assert rule == {
        "apiGroups": [""],
        "resources": ["pods/exec"],
        "resourceNames": ["chat-g3-1", "chat-g3-2", "chat-g3-3"],
        "verbs": ["create"],
    }
    assert rank_exec_rules(rank_identities("chat", 0, group_shape(4, 1, gpus_per_node=8))) == []
