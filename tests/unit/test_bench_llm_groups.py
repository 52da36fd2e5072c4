"""The pure helpers of benchmarks/llm_groups.py: the rank fault's timeline and the results block."""

from __future__ import annotations

import pytest

from benchmarks.llm_deployment import ratios
from benchmarks.llm_groups import MILESTONES, fault_timeline, render

MARKS = {"leader_out": 101.0, "recreated": 104.5, "whole": 110.0, "endpoint": 110.25, "first_token": 111.0}
LOAD = {k: 3.0 for k in MARKS}


def test_each_milestone_is_timed_from_the_kill_and_from_the_one_before() -> None:
    got = fault_timeline(MARKS, 100.0, LOAD)
    assert [m["milestone"] for m in got] == [k for k, _ in MILESTONES]
    assert [m["after_kill_s"] for m in got] == [1.0, 4.5, 10.0, 10.25, 11.0]
    assert [m["step_s"] for m in got] == [1.0, 3.5, 5.5, 0.25, 0.75]
    assert all(m["loadavg_1m"] == 3.0 for m in got)


def test_a_missing_milestone_is_named() -> None:
    marks = {k: v for k, v in MARKS.items() if k != "whole"}
    with pytest.raises(ValueError, match="no 'whole' \\(group whole and Ready\\)"):
        fault_timeline(marks, 100.0, LOAD)


def test_a_milestone_seen_before_the_one_it_follows_is_refused() -> None:
    with pytest.raises(ValueError, match="'recreated'"):
        fault_timeline({**MARKS, "recreated": 100.5}, 100.0, LOAD)
    with pytest.raises(ValueError, match="'leader_out'"):
        fault_timeline(MARKS, 102.0, LOAD)  # before the kill


def _row(side: str, c: int, tps: float, ttft: float) -> dict[str, object]:
    return {"side": side, "concurrency": c, "output_tokens_per_s": tps, "ttft_ms_p50": ttft,
            "ttft_ms_p90": ttft, "itl_ms_p50": 10.0, "loadavg_1m": 2.5}  # fmt: skip


def test_the_results_block_says_what_the_group_runs_on_and_gives_the_ratios_and_the_timeline() -> None:
    rows = [_row("one", 1, 20.0, 100.0), _row("grp", 1, 10.0, 150.0)]
    res = {
        "config": {"input_tokens": 64, "output_tokens": 32, "client_cpus": "1",
                   "loadavg_1m_at_start": 2.0, "loadavg_1m_at_end": 3.0,
                   "group_ranks_on": {"1": "gpu-h100-1", "0": "gpu-h100-0"}},
        "results": rows,
        "ratios": ratios(rows, [1], over="grp", base="one"),
        "faults": [{"loadavg_1m_at_kill": 2.2, "timeline": fault_timeline(MARKS, 100.0, LOAD)}],
    }  # fmt: skip
    text = render(res)
    assert "(group `grp-g0`, rank 0 on gpu-h100-0, rank 1 on gpu-h100-1:" in text
    assert "no TensorRT-LLM, no GPU" in text and "not a multi-GPU speed-up" in text
    assert "Group over one rank: tokens/s 0.5x and TTFT p50 1.5x at c = 1." in text
    assert "| 1 | 20.0 / 10.0          | 100.0 / 150.0 |" in text
    assert (
        "Fault 1: rank 1's `ggml-rpc-server` killed (load 2.2); after the kill: leader out of the Service "
        "1.0 s, both rank pods new 4.5 s, group whole and Ready 10.0 s, leader back in the Service 10.25 s, "
        "first streamed token 11.0 s (load 3.0)." in text
    )
