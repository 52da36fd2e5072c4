"""Rank groups' pure rules (trtforge_operator.planning.groups): shape, identities, gang, clique, faults."""

from __future__ import annotations

from typing import Any

import pytest
from trtforge_operator.observe.views import ContainerView, PodView, Terminated
from trtforge_operator.planning import groups
from trtforge_operator.planning.groups import GroupShape, GroupShapeError, GroupState

from trtforge.contract.termination import TerminationMessage


def test_a_mapping_larger_than_a_node_is_a_group_of_whole_nodes() -> None:
    assert groups.group_shape(8, 2, 8) == GroupShape(2, 8)
    assert groups.group_shape(4, 4, 4) == GroupShape(4, 4)
    assert groups.group_shape(2, 1, 1) == GroupShape(2, 1)


def test_a_mapping_that_fits_one_node_stays_one_pod() -> None:
    s = groups.group_shape(4, 2, 8)
    assert s == GroupShape(1, 8) and not s.is_group
    assert groups.group_shape(1, 1, 8) == GroupShape(1, 1)


def test_a_mapping_that_splits_no_whole_nodes_is_refused_by_name() -> None:
    with pytest.raises(GroupShapeError, match=r"tensor 3 x pipeline 2 = 6 GPUs .* multiple of 4"):
        groups.group_shape(3, 2, 4)
    with pytest.raises(GroupShapeError, match="tensor 0"):
        groups.group_shape(0, 1, 8)


def test_rank_identities_are_stable_and_derived() -> None:
    ids = groups.rank_identities("llama", 1, GroupShape(3, 8))
    assert ids == groups.rank_identities("llama", 1, GroupShape(3, 8))
    assert [i.pod for i in ids] == ["llama-g1-0", "llama-g1-1", "llama-g1-2"]
    assert ids[0].leader and not ids[1].leader
    assert ids[2].host == "llama-g1-2.llama-g1"
    assert ids[1].labels() == {groups.LABEL_GROUP: "llama-g1", groups.LABEL_RANK: "1"}
    long = groups.rank_identities("x" * 80, 12, GroupShape(2, 8))
    assert all(len(i.pod) <= 63 for i in long) and long[0].group != long[0].pod


def test_each_rank_gets_the_serve_llm_arguments_of_its_role() -> None:
    ids = groups.rank_identities("m", 0, GroupShape(3, 1))
    assert groups.rank_arguments(ids[0], ids) == [
        "--world-size", "3", "--worker", "m-g0-1.m-g0:50052:8000", "--worker", "m-g0-2.m-g0:50052:8000",
    ]  # fmt: skip
    assert groups.rank_arguments(ids[2], ids) == ["--rank", "2", "--world-size", "3", "--rank-port", "50052"]


def _pod(
    rank: int, *, ready: bool = True, restarts: int = 0, term: Terminated | None = None, **kw: Any
) -> PodView:
    c = ContainerView("runtime", ready, restarts, None, term)
    return PodView(
        name=f"m-g0-{rank}", namespace="ns", uid=str(rank),
        labels={groups.LABEL_GROUP: "m-g0", groups.LABEL_RANK: str(rank)}, annotations={},
        node=f"node-{rank}",
        phase="Running", ready=ready, containers=(c,), created=100.0, **kw,
    )  # fmt: skip


SHAPE = GroupShape(2, 1)


def test_a_group_serves_only_when_every_rank_is_ready() -> None:
    whole = groups.assess_group("m-g0", SHAPE, [_pod(0), _pod(1)], [], 200)
    assert whole.state is GroupState.WHOLE and whole.serves
    assert groups.leader_whole_label(whole) == {groups.LABEL_GROUP_WHOLE: "true"}
    forming = groups.assess_group("m-g0", SHAPE, [_pod(0), _pod(1, ready=False)], [], 200)
    assert (forming.state, forming.missing, forming.serves) == (GroupState.FORMING, (1,), False)
    assert groups.leader_whole_label(forming) == {groups.LABEL_GROUP_WHOLE: None}
    assert groups.assess_group("m-g0", SHAPE, [_pod(0)], [], 200).missing == (1,)


def test_no_rank_runs_alone_for_long() -> None:
    a = groups.assess_group("m-g0", SHAPE, [_pod(0)], [], 100 + 901)
    assert a.state is GroupState.BROKEN and "ranks [1] not ready" in a.reason


def test_a_ranks_death_breaks_the_whole_group_and_every_pod_goes() -> None:
    a = groups.assess_group("m-g0", SHAPE, [_pod(0), _pod(1, ready=False, restarts=1)], [], 200)
    assert a.state is GroupState.BROKEN and "rank 1 (m-g0-1)" in a.reason
    r = groups.plan_recovery(a, [_pod(0), _pod(1)])
    assert r is not None and r.delete_pods == ("m-g0-0", "m-g0-1") and not r.avoid_nodes
    assert (
        groups.assess_group("m-g0", SHAPE, [_pod(0), _pod(1, deleting=True)], [], 200).state
        is GroupState.BROKEN
    )
    assert groups.plan_recovery(groups.assess_group("m-g0", SHAPE, [_pod(0), _pod(1)], [], 200), []) is None


def test_an_xid_under_any_rank_recreates_the_group_away_from_that_gpu_and_node() -> None:
    msg = TerminationMessage(reason="GPUFault", message="Xid 79", xid=79, gpu="GPU-abc")
    term = Terminated(86, "Error", msg.model_dump_json(), 150.0)
    pods = [_pod(0), _pod(1, ready=False, restarts=1, term=term)]
    a = groups.assess_group("m-g0", SHAPE, pods, [], 200)
    assert (
        a.state is GroupState.BROKEN and "Xid 79 on GPU GPU-abc under pod m-g0-1 on node node-1" in a.reason
    )
    r = groups.plan_recovery(a, pods, already_avoided={"node-9"})
    assert r is not None
    assert r.avoid_nodes == {"node-1", "node-9"} and r.avoid_gpus == {"GPU-abc"}
    assert [x.xid for x in r.records] == [79]
    assert groups.avoid_affinity(r.avoid_nodes) == {
        "key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-1", "node-9"],
    }  # fmt: skip


def test_ranks_share_one_gpu_clique_where_nodes_have_one() -> None:
    assert groups.clique_affinity("m-g0", [{"a": "b"}, {}]) is None
    aff = groups.clique_affinity("m-g0", [{groups.CLIQUE_LABEL: "c1"}, {}])
    assert aff is not None
    term = aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term == {
        "labelSelector": {"matchLabels": {groups.LABEL_GROUP: "m-g0"}},
        "topologyKey": groups.CLIQUE_LABEL,
    }
    sel = aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert sel == [{"matchExpressions": [{"key": groups.CLIQUE_LABEL, "operator": "Exists"}]}]


def test_pods_labelled_for_another_group_are_not_read() -> None:
    msg = TerminationMessage(reason="GPUFault", message="Xid 79", xid=79, gpu="GPU-abc")
    stranger = _pod(1, ready=False, restarts=1, term=Terminated(86, "Error", msg.model_dump_json(), 150.0))
    stranger = PodView(
        **{**stranger.__dict__, "labels": {groups.LABEL_GROUP: "other-g0", groups.LABEL_RANK: "1"}}
    )
    a = groups.assess_group("m-g0", SHAPE, [_pod(0), stranger], [], 200)
    assert (a.state, a.missing, a.faulted) == (GroupState.FORMING, (1,), ())


def test_autoscaling_counts_groups_by_their_leaders_and_waits_for_a_rollout() -> None:
    sel = groups.scale_selector({"trtforge.io/inferencedeployment": "m"})
    assert sel == "trtforge.io/inferencedeployment=m,trtforge.io/rank=0"
    assert groups.groups_to_run(3, 2, rolling_out=False) == 3
    assert groups.groups_to_run(3, 2, rolling_out=True) == 2
    with pytest.raises(ValueError, match="replicas -1"):
        groups.groups_to_run(-1, 2, rolling_out=False)
