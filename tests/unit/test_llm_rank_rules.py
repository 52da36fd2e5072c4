"""The rank group's pure decisions (trtforge_runtime.llm.ranks): rendezvous, reports, tear-down."""

from __future__ import annotations

import pytest
from trtforge_runtime.llm import ranks
from trtforge_runtime.llm.ranks import GroupAction, GroupPolicy, RankReport, RankSeen

W = [ranks.Worker(1, "g0-1.g0", 50052, 8000), ranks.Worker(2, "g0-2.g0", 50052, 8000)]
P = GroupPolicy(meet_limit_s=100, unreachable_grace_s=2)


def test_workers_parse_in_rank_order_and_bad_ones_are_named() -> None:
    ws = ranks.workers_from_args(3, ["a:1:2", "b:3:4"])
    assert [(w.rank, w.rpc_endpoint, w.supervisor) for w in ws] == [(1, "a:1", "a:2"), (2, "b:3", "b:4")]
    assert ranks.rpc_argument(reversed(ws)) == "a:1,b:3"
    with pytest.raises(ValueError, match="--worker given 1 times for --world-size 3"):
        ranks.workers_from_args(3, ["a:1:2"])
    with pytest.raises(ValueError, match="HOST:RANK_PORT:PROBE_PORT"):
        ranks.parse_worker(1, "a:1")
    with pytest.raises(ValueError, match="70000 is not a port"):
        ranks.parse_worker(1, "a:70000:1")
    assert ranks.workers_from_args(1, []) == []


@pytest.mark.parametrize(
    ("live", "ready", "report"),
    [
        (None, None, RankReport.UNREACHABLE),
        (503, None, RankReport.NOT_LIVE),
        (200, 503, RankReport.NOT_READY),
        (200, None, RankReport.NOT_READY),
        (200, 200, RankReport.READY),
    ],
)
def test_a_supervisors_answers_classify(live: int | None, ready: int | None, report: RankReport) -> None:
    assert ranks.classify(live, ready) is report


def test_the_leader_waits_naming_each_missing_rank_and_starts_when_all_are_ready() -> None:
    seen = {1: RankSeen(RankReport.READY)}
    v = ranks.before_start(W, seen, 5, P)
    assert (v.ready, v.live, v.action, v.missing) == (False, True, GroupAction.WAIT, (2,))
    assert "waiting for 1 of 2 worker ranks: rank 2 (g0-2.g0:8000): unreachable" in v.detail
    seen[2] = RankSeen(RankReport.NOT_READY)
    assert "rank 2 (g0-2.g0:8000): not ready" in ranks.before_start(W, seen, 5, P).detail
    seen[2] = RankSeen(RankReport.READY)
    assert ranks.before_start(W, seen, 5, P).action is GroupAction.START_SERVER


def test_ranks_that_never_meet_end_the_leader_past_the_limit() -> None:
    v = ranks.before_start(W, {}, 101, P)
    assert (v.live, v.action, v.missing) == (False, GroupAction.TEAR_DOWN, (1, 2))
    assert v.detail.startswith("ranks did not meet within 100 s")


def test_a_rank_not_live_tears_the_group_down_at_once() -> None:
    seen = {1: RankSeen(RankReport.READY), 2: RankSeen(RankReport.NOT_LIVE)}
    v = ranks.while_serving(W, seen, 10, P)
    assert (v.ready, v.live, v.action, v.missing) == (False, False, GroupAction.TEAR_DOWN, (2,))
    assert "rank 2 (g0-2.g0:8000): not live" in v.detail


def test_a_silent_rank_is_gone_only_past_the_grace() -> None:
    s = ranks.next_seen(RankSeen(RankReport.READY), RankReport.UNREACHABLE, 10)
    assert s.unreachable_since == 10
    s = ranks.next_seen(s, RankReport.UNREACHABLE, 11)
    assert s.unreachable_since == 10  # the run of silence counts from its first answer
    seen = {1: RankSeen(RankReport.READY), 2: s}
    v = ranks.while_serving(W, seen, 11.5, P)
    assert (v.ready, v.live, v.action) == (False, True, GroupAction.WAIT)
    v = ranks.while_serving(W, seen, 12.5, P)
    assert (v.live, v.action, v.missing) == (False, GroupAction.TEAR_DOWN, (2,))
    assert ranks.next_seen(s, RankReport.READY, 13).unreachable_since is None


def test_a_whole_group_is_ready_and_live() -> None:
    seen = {1: RankSeen(RankReport.READY), 2: RankSeen(RankReport.READY)}
    assert ranks.while_serving(W, seen, 1, P) == ranks.GroupVerdict(True, True, GroupAction.WAIT)


def test_a_worker_is_ready_only_while_its_process_runs_and_listens() -> None:
    assert ranks.worker_ready(True, True)
    assert not ranks.worker_ready(True, False)
    assert not ranks.worker_ready(False, True)


def test_listening_ports_come_from_the_kernel_table() -> None:
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:C3D4 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 1\n"
        "   1: 0100007F:1F40 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  0 0 2\n"
    )
    assert ranks.listening_ports(table) == {0xC3D4}


def test_a_leaderworkersets_variables_place_the_rank_and_name_the_workers() -> None:
    env = {"LWS_LEADER_ADDRESS": "m-mn-0.m-mn.ns", "LWS_GROUP_SIZE": "3", "LWS_WORKER_INDEX": "0"}
    p = ranks.from_lws(env, 50052, 8000)
    assert (p.rank, p.world_size) == (0, 3)
    assert [w.rpc_endpoint for w in p.workers] == ["m-mn-0-1.m-mn.ns:50052", "m-mn-0-2.m-mn.ns:50052"]
    assert [w.supervisor for w in p.workers] == ["m-mn-0-1.m-mn.ns:8000", "m-mn-0-2.m-mn.ns:8000"]
    worker = ranks.from_lws({**env, "LWS_WORKER_INDEX": "2"}, 50052, 8000)
    assert (worker.rank, worker.workers) == (2, ())
    with pytest.raises(ValueError, match="LWS_GROUP_SIZE is not set"):
        ranks.from_lws({**env, "LWS_GROUP_SIZE": ""}, 1, 2)
    with pytest.raises(ValueError, match="LWS_WORKER_INDEX 3 is outside the group of 3"):
        ranks.from_lws({**env, "LWS_WORKER_INDEX": "3"}, 1, 2)


def test_a_worker_restarted_between_two_questions_tears_the_group_down() -> None:
    # The leader's server met run "a" of rank 2; rank 2 now answers ready from run "b": it died and
    # came back between two questions, and the server's connection is to a process that is gone.
    met = {1: "x", 2: "a"}
    seen = {1: RankSeen(RankReport.READY, incarnation="x"), 2: RankSeen(RankReport.READY, incarnation="b")}
    v = ranks.while_serving(W, seen, 10, P, met)
    assert (v.action, v.live, v.missing) == (ranks.GroupAction.TEAR_DOWN, False, (2,))
    same = {1: RankSeen(RankReport.READY, incarnation="x"), 2: RankSeen(RankReport.READY, incarnation="a")}
    assert ranks.while_serving(W, same, 10, P, met).action is ranks.GroupAction.WAIT
    # a silent rank keeps the run it was last seen in
    s = ranks.next_seen(seen[2], RankReport.UNREACHABLE, 11)
    assert s.incarnation == "b"
