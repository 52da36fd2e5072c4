"""The pure parts of the paired benchmarks (benchmarks/paired.py, benchmarks/ab_builds.py): the order
of the windows and how rounds reduce to the published figures. The windows' numbers are inputs here."""

from __future__ import annotations

import pytest

from benchmarks.ab_builds import paired_summary, round_order
from benchmarks.paired import best_per_round, rotation, setting_for, summarize_point
from benchmarks.servers import kinds, sweep_small_batch


def w(throughput: float, p99: float = 100.0, **extra: object) -> dict[str, object]:
    return {"throughput": throughput, "p99_ms": p99, "errors": 0, **extra}


def test_rotation_puts_each_server_first_once_per_cycle_and_keeps_their_cycle() -> None:
    names = ["trtforge", "triton", "mlserver"]
    orders = [rotation(names, r) for r in range(3)]
    assert [o[0] for o in orders] == names
    for o in orders:
        i = o.index("trtforge")
        assert o[(i + 1) % 3] == "triton" and sorted(o) == sorted(names)
    assert rotation(names, 3) == names and rotation([], 5) == []


def test_builds_alternate_which_goes_first() -> None:
    assert [round_order(r) for r in range(3)] == [("A", "B"), ("B", "A"), ("A", "B")]


def test_rounds_are_paired_window_by_window_not_by_their_medians() -> None:
    # The machine slows down in round 2 for both; B is 10% ahead in two rounds, 10% behind in one.
    tf = [w(110.0, 90.0, ceiling=200.0), w(55.0, 200.0, ceiling=100.0), w(180.0, 80.0, ceiling=200.0)]
    peer = [w(100.0, 100.0), w(50.0, 210.0), w(200.0, 70.0)]
    s = summarize_point({"trtforge": tf, "triton": peer}, "triton")
    assert s["paired_ratio"] == {"median": 1.1, "min": 0.9, "max": 1.1, "rounds_at_or_above": 2, "rounds": 3}
    assert s["median"]["trtforge"] == {"throughput": 110.0, "p99_ms": 90.0, "errors": 0}
    assert s["median"]["triton"]["throughput"] == 100.0
    # each window against the ceiling timed next to it: 55%, 55%, 90%
    assert s["pct_of_ceiling"] == {"median": 55.0, "min": 55.0}
    assert s["ceiling"] == {"median": 200.0, "min": 100.0, "reachable_share": 1.0}
    assert s["verdict"] == "win"


def test_a_window_is_judged_against_its_own_ceiling_not_the_rounds_first() -> None:
    # Same server rate, the machine's minute moves the ceiling under it: 100/125 and 100/100.
    tf = [w(100.0, ceiling=125.0), w(100.0, ceiling=100.0)]
    s = summarize_point({"trtforge": tf, "triton": [w(90.0), w(90.0)]}, "triton")
    assert s["pct_of_ceiling"] == {"median": 90.0, "min": 80.0}


def test_a_higher_median_p99_is_not_a_win() -> None:
    tf = [w(120.0, 400.0, ceiling=200.0)]
    s = summarize_point({"trtforge": tf, "triton": [w(100.0, 300.0)]}, "triton")
    assert s["verdict"] == "win, p99 higher"


def test_each_round_keeps_the_servers_best_protocol() -> None:
    best = best_per_round({"http": [w(120.0), w(90.0)], "grpc": [w(100.0), w(95.0)]})
    assert [(b["protocol"], b["throughput"]) for b in best] == [("http", 120.0), ("grpc", 95.0)]
    assert best_per_round({}) == []


def test_ab_summary_counts_the_rounds_where_b_is_ahead() -> None:
    a = [w(100.0, 300.0, server_cpu_ms=20.0), w(80.0, 320.0, server_cpu_ms=21.0)]
    b = [w(105.0, 280.0, server_cpu_ms=19.0), w(76.0, 330.0, server_cpu_ms=20.0)]
    s = paired_summary(a, b)
    assert s["ratio_b_over_a"] == {"median": 1.0, "min": 0.95, "max": 1.05, "rounds_b_ahead": 1}
    assert s["median_throughput"] == {"A": 90.0, "B": 90.5}
    with pytest.raises(ValueError):
        paired_summary(a, b[:1])  # rounds are pairs: a missing window is an error, not a shorter run


def test_the_grids_chosen_label_finds_its_setting() -> None:
    trtforge = kinds()["trtforge"]
    s = setting_for(trtforge, 2, "2 inst x 1 thr, batch<=4, delay 2000us, + solo session")
    assert (s.instances, s.threads, s.max_batch, s.queue_delay_us) == (2, 1, 4, 2000)
    with pytest.raises(ValueError, match="triton: no setting of its sweep is labelled '3 inst'"):
        setting_for(kinds()["triton"], 2, "3 inst")


def test_the_sweeps_small_batch_is_the_side_by_side_sessions_best() -> None:
    ceiling = {
        "per_batch": [{"batch": 16, "images_per_s": 300.0}],  # one 2-thread session: not this form
        "parallel_sessions": [
            {"batch": 1, "images_per_s": 284.3},
            {"batch": 2, "images_per_s": 286.6},
            {"batch": 8, "images_per_s": 270.4},
        ],
    }
    assert sweep_small_batch(ceiling) == 2  # batch 1 is within 3% of batch 2, but a batcher batches
    ceiling["parallel_sessions"] = [
        {"batch": 1, "images_per_s": 200.0},
        {"batch": 2, "images_per_s": 240.0},
        {"batch": 4, "images_per_s": 255.0},
        {"batch": 16, "images_per_s": 260.0},
    ]
    assert sweep_small_batch(ceiling) == 4  # the smallest within 3% of the best (252.2 img/s)
    ceiling["parallel_sessions"] = [  # ResNet-50 on these cores: noise picks the best
        {"batch": 1, "images_per_s": 24.1},
        {"batch": 2, "images_per_s": 24.5},
        {"batch": 16, "images_per_s": 24.6},
    ]
    assert sweep_small_batch(ceiling) == 2
    assert sweep_small_batch({"per_batch": []}) == 4  # a ceiling without side-by-side sessions


def test_a_grids_small_batch_reaches_every_server_with_a_batcher() -> None:
    for name in ("trtforge", "triton", "mlserver"):
        batches = [s.max_batch for s in kinds()[name].sweep(2, 2)]
        assert batches == [32, 32, 2, 2], name
    s = setting_for(kinds()["triton"], 2, "2 inst x 1 thr, batch<=2, delay 2000us", small_batch=2)
    assert (s.max_batch, s.queue_delay_us) == (2, 2000)


def test_the_windows_line_names_the_concurrencies_whose_windows_grew() -> None:
    from benchmarks.paired import _windows_text
    from benchmarks.serving import Windows

    grown = Windows(10.0, 2.5, rate=24.0).as_dict([1, 8, 64])
    assert _windows_text(grown) == "10 s after 2.5 s (c=64: 26.7 s after 5.3 s)"
    assert _windows_text({"seconds": 4.0, "warmup": 1.0}) == "4 s after 1 s"  # a file from before


def test_near_the_ceiling_is_judged_against_what_the_points_concurrency_can_reach() -> None:
    # ResNet-50 at c=1, shaped like measured medians: both servers at the bound
    # of one request at a time (22.9 img/s), which is 89% of the best ceiling (25.7, two in flight)
    tf = [w(23.86, 49.0, ceiling=25.72)]
    peer = [w(24.39, 47.2)]
    assert summarize_point({"trtforge": tf, "triton": peer}, "triton")["verdict"] == "loss"
    s = summarize_point({"trtforge": tf, "triton": peer}, "triton", reachable=22.9 / 25.7)
    assert s["verdict"] == "tie (5% band near the ceiling)"
    assert s["ceiling"]["reachable_share"] == 0.891
