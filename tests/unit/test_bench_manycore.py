"""The pure parts of the many-core benchmark (benchmarks/manycore.py): how a point's rounds become its
published row, and how sampled CPU ticks become each process's busy cores. Numbers are inputs here."""

from __future__ import annotations

import pytest

from benchmarks.manycore import busy_per_process, median_round, render
from benchmarks.report import _manycore_share


def rnd(i: int, throughput: float, ceiling: float, errors: int = 0) -> dict[str, object]:
    return {
        "model": "squeezenet",
        "n": 14,
        "setting": "default",
        "protocol": "http",
        "concurrency": 112,
        "round": i,
        "throughput": throughput,
        "round_ceiling": ceiling,
        "pct_of_round_ceiling": round(100 * throughput / ceiling, 1),
        "pct_of_ceiling": round(100 * throughput / 2000, 1),
        "ceiling": {"best": {"images_per_s": 2000.0, "batch": 4}},
        "p50_ms": 90.0,
        "p99_ms": 100.0 + i,
        "server_cpu_cores": 12.0,
        "errors": errors,
        "completed": int(throughput * 5),
        "server_cores_loaded": 13.0,
        "client_cpu_cores": 0.2,
        "workers": [{"pid": 1, "cpus": 4, "busy_cores": 3.9, "loop_cores": 0.4}],
    }


def test_the_row_is_the_median_round_by_its_share_of_its_own_ceiling_not_by_throughput() -> None:
    # Round 2 served the most but on a fast minute (its ceiling too): it is not the median share.
    rounds = [rnd(1, 1500.0, 1800.0), rnd(2, 1700.0, 2200.0, errors=1), rnd(3, 1600.0, 1840.0)]
    row = median_round(rounds)
    assert row["round"] == 1  # shares 83.3, 77.3, 87.0: the median is round 1's
    assert row["throughput"] == 1500.0 and row["p99_ms"] == 101.0
    assert row["round_shares"] == {"median": 83.3, "min": 77.3, "max": 87.0}
    assert row["errors"] == 1  # a wrong answer in any round stays visible on the row
    assert [r["round"] for r in row["rounds"]] == [1, 2, 3]
    assert set(row["rounds"][0]) == {
        "round",
        "throughput",
        "round_ceiling",
        "pct_of_round_ceiling",
        "p99_ms",
        "errors",
        "server_cores_loaded",
    }


def test_an_even_count_of_rounds_takes_the_lower_middle_and_none_is_refused() -> None:
    row = median_round([rnd(1, 1000.0, 2000.0), rnd(2, 1800.0, 2000.0)])
    assert row["round_shares"]["median"] == 50.0
    with pytest.raises(ValueError, match="at least one round"):
        median_round([])


def test_busy_cores_are_the_median_rate_so_the_idle_start_does_not_dilute_them() -> None:
    tick = 100.0
    # pid 7: idle for the first interval (the load generator starting), then 3.8 cores of 4;
    # its main thread 0.5 of a core. pid 8: the supervisor, never busy. pid 9 appears late.
    samples = [
        (0.0, {7: (0, 0), 8: (5, 5)}),
        (1.0, {7: (2, 1), 8: (5, 5)}),
        (2.0, {7: (382, 51), 8: (5, 5), 9: (0, 0)}),
        (3.0, {7: (762, 101), 8: (5, 5), 9: (100, 20)}),
        (4.0, {7: (1142, 151), 8: (5, 5), 9: (200, 40)}),
    ]
    out = busy_per_process(samples, {7: 4, 8: 14, 9: 3}, tick)
    assert out == [
        {"pid": 7, "cpus": 4, "busy_cores": 3.8, "loop_cores": 0.5},
        {"pid": 9, "cpus": 3, "busy_cores": 1.0, "loop_cores": 0.2},
    ]


def test_the_rendered_table_and_the_target_read_the_median_round() -> None:
    row = median_round([rnd(1, 1500.0, 1800.0), rnd(2, 1700.0, 2200.0), rnd(3, 1600.0, 1840.0)])
    res = {"host_cpus": 16, "config": {"rounds": 3}, "runs": [row]}
    text = render(res)
    assert "3 rounds per point" in text
    assert "1800 / 2200 / 1840" in text and "**83.3%** (77.3-87.0%)" in text
    assert "13.0 (3.9/4)" in text
    assert _manycore_share(row) == 83.3
    old = {k: v for k, v in row.items() if k not in ("round_shares", "rounds")}
    assert _manycore_share(old) == row["pct_of_ceiling"]  # results from before the rounds
    assert "of its round's ceiling" not in render({"host_cpus": 16, "config": {}, "runs": [old]})
