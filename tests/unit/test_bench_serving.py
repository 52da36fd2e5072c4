"""The serving benchmark's choice of each server's setting per concurrency band (pure functions)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.serving import (
    MET_VERDICTS,
    TIE,
    WIN,
    Windows,
    ceil_pct,
    near_best,
    pick_best,
    pick_paired,
    reachable_share,
    summarize,
    tiebreak_text,
    verdict,
)


def pt(throughput: float, p99_ms: float) -> dict[str, Any]:
    return {"throughput": throughput, "p99_ms": p99_ms}


def test_one_concurrency_takes_the_most_throughput_and_ties_to_the_lower_p99() -> None:
    assert pick_best([[pt(100, 50)], [pt(110, 60)], [pt(90, 10)]]) == 1
    # within 3% of the best, the lower p99 wins
    assert pick_best([[pt(100, 50)], [pt(98, 40)], [pt(90, 10)]]) == 1


def test_a_band_is_decided_by_all_its_windows_not_the_last_alone() -> None:
    # Shaped like a measured ResNet-50 case (its sweep had no c=8 window; these c=8
    # figures are illustrative): at c=32 alone setting 0 is within 3% of setting 1 with the lower
    # p99, so it wins; at c=8 it trails by 10%, and the two windows together pick setting 1.
    at8 = [pt(18.2, 650), pt(20.3, 530)]
    at32 = [pt(22.4, 1558), pt(22.6, 1669)]
    assert pick_best([[at32[0]], [at32[1]]]) == 0
    assert pick_best([[at8[0], at32[0]], [at8[1], at32[1]]]) == 1


def test_a_band_tie_goes_to_the_lower_p99_over_the_band() -> None:
    # equal mean shares of the best throughput; setting 1's p99s are lower on the whole
    a = [pt(100, 100), pt(98, 400)]
    b = [pt(98, 60), pt(100, 420)]
    assert pick_best([a, b]) == 1


def test_settings_with_different_bands_are_refused() -> None:
    with pytest.raises(ValueError, match="same non-empty band"):
        pick_best([[pt(1, 1)], [pt(1, 1), pt(2, 2)]])
    with pytest.raises(ValueError, match="same non-empty band"):
        pick_best([[], []])


def test_windows_grow_until_every_worker_gets_its_answers_at_the_ceiling_rate() -> None:
    w = Windows(10.0, 2.5, rate=24.0)  # ResNet-50's windows on 2 cores
    assert w.window(1) == 10.0 and w.warm(1) == 2.5  # never shorter than asked
    assert w.window(64) == pytest.approx(10 * 64 / 24.0)  # 10 answers each, at 24 img/s in all
    assert w.warm(64) == pytest.approx(2 * 64 / 24.0)
    assert w.window(32) > w.window(8) >= 10.0
    assert Windows(4.0, 1.0, rate=250.0).window(64) == 4.0  # SqueezeNet's are long enough already


def test_windows_stay_fixed_without_a_rate_or_with_no_answers_asked() -> None:
    for w in (Windows(10.0, 2.5), Windows(10.0, 2.5, rate=24.0, stream_answers=0)):
        assert (w.window(64), w.warm(64)) == (10.0, 2.5)
    assert Windows(10.0, 2.5, rate=24.0).as_dict([1, 64])["by_concurrency"] == {
        "1": [10.0, 2.5],
        "64": [26.7, 5.3],
    }


def test_a_grid_point_is_judged_against_the_ceiling_timed_next_to_it() -> None:
    def point(c: int, throughput: float, ceiling: float | None = None) -> dict[str, Any]:
        p: dict[str, Any] = {"protocol": "http", "concurrency": c, "throughput": throughput, "p99_ms": 100.0}
        if ceiling is not None:
            p["ceiling"] = ceiling
        return p

    # the model's ceiling (timed before the sweep) read a slow minute: 200; the windows' ceilings 250
    mres = {
        "ceiling": {"best": {"images_per_s": 200.0}},
        "servers": {
            "trtforge": {"points": [point(8, 225.0, 250.0), point(32, 240.0)]},  # c=32: an old run's
            "triton": {"points": [point(8, 230.0, 250.0), point(32, 200.0, 250.0)]},
        },
    }
    ceil_pct(mres)
    shares = {p["concurrency"]: p["pct_of_ceiling"] for p in mres["servers"]["trtforge"]["points"]}
    assert shares == {8: 90.0, 32: 120.0}
    summary = summarize({"models": {"squeezenet": mres}})["squeezenet"]
    # 225 is within 5% of 230: near the model's ceiling (200) a tie, but not near the window's (250)
    assert summary["points"][0]["verdict"] == "loss"
    assert summary["min_pct_of_ceiling_c_ge_8_http"] == 90.0


def test_near_the_ceiling_the_band_covers_the_p99_as_well_as_the_rate() -> None:
    # both servers at 97-100% of a 100 img/s ceiling: a 2% higher p99 is inside the band
    assert verdict(pt(98.0, 1020.0), pt(100.0, 1000.0), ceiling=100.0) == TIE
    assert verdict(pt(101.0, 1040.0), pt(100.0, 1000.0), ceiling=100.0) == TIE
    # outside the band on the p99 (8% higher) or on the rate (7% lower), it is no tie
    assert verdict(pt(101.0, 1080.0), pt(100.0, 1000.0), ceiling=100.0) == "win, p99 higher"
    assert verdict(pt(98.0, 1080.0), pt(100.0, 1000.0), ceiling=100.0) == "tie, p99 higher"
    assert verdict(pt(93.0, 900.0), pt(100.0, 1000.0), ceiling=100.0) == "loss"
    assert {TIE, WIN} == MET_VERDICTS


def test_far_from_the_ceiling_there_is_no_band() -> None:
    # both at 70% of the ceiling: a 1% higher p99 or a 1% lower rate decides
    assert verdict(pt(71.0, 101.0), pt(70.0, 100.0), ceiling=100.0) == "win, p99 higher"
    assert verdict(pt(69.5, 90.0), pt(70.0, 100.0), ceiling=100.0) == "loss"
    assert verdict(pt(70.0, 100.0), pt(70.0, 100.0), ceiling=100.0) == WIN


# ResNet-50's ceiling as one full run measured it on 2 cores (img/s)
RESNET_CEILING = {
    "per_batch": [
        {"batch": 1, "images_per_s": 22.98},
        {"batch": 2, "images_per_s": 24.07},
        {"batch": 8, "images_per_s": 26.56},
    ],
    "parallel_sessions": [
        {"batch": 1, "sessions": 2, "images_per_s": 25.55},
        {"batch": 4, "sessions": 2, "images_per_s": 26.74},
    ],
    "best": {"batch": 4, "sessions": 2, "images_per_s": 26.74},
}


def test_the_reachable_ceiling_counts_the_requests_a_configuration_needs_in_flight() -> None:
    assert reachable_share(RESNET_CEILING, 1) == 22.98 / 26.74  # a batch of one on one session
    assert reachable_share(RESNET_CEILING, 2) == 25.55 / 26.74  # two sessions of one each
    assert reachable_share(RESNET_CEILING, 8) == 1.0
    # results without the per-configuration timings judge every point against the best
    assert reachable_share({"best": {"images_per_s": 26.74}}, 1) == 1.0


def test_at_c1_both_servers_at_the_one_request_bound_tie() -> None:
    def point(throughput: float, p99: float) -> dict[str, Any]:
        return {
            "protocol": "http",
            "concurrency": 1,
            "throughput": throughput,
            "p99_ms": p99,
            "ceiling": 26.5,
        }

    mres = {
        "ceiling": RESNET_CEILING,
        "servers": {"trtforge": {"points": [point(23.5, 49.0)]}, "triton": {"points": [point(24.0, 47.5)]}},
    }
    ceil_pct(mres)
    got = summarize({"models": {"resnet50": mres}})["resnet50"]["points"][0]
    assert got["verdict"] == TIE
    assert got["reachable_share"] == 0.859
    # against the best ceiling (26.5, two requests in flight) neither is near it: a loss
    assert verdict(point(23.5, 49.0), point(24.0, 47.5), ceiling=26.5) == "loss"


def test_near_best_is_every_setting_within_the_tie_of_the_best_share() -> None:
    band = [[pt(100, 50)], [pt(98, 40)], [pt(90, 10)]]
    assert near_best(band) == [0, 1]
    assert near_best(band, tie=0.0) == [0]
    assert pick_best(band) in near_best(band)


def test_paired_rounds_choose_by_the_median_round_not_the_luckiest_window() -> None:
    # Shaped like a measured ResNet-50 case: candidate 1 is ahead by about 4% in
    # most rounds; one round on a slow minute reads it far behind, which a single window could.
    rounds = [
        [[pt(20.3, 440)], [pt(21.4, 420)]],
        [[pt(20.2, 439)], [pt(21.3, 417)]],
        [[pt(21.3, 384)], [pt(18.0, 500)]],
    ]
    assert pick_paired(rounds) == 1
    # ... and its last round alone, as one sweep window, would have chosen candidate 0
    assert pick_best(rounds[2]) == 0


def test_paired_rounds_tie_goes_to_the_lower_median_p99() -> None:
    rounds = [
        [[pt(100, 60), pt(100, 400)], [pt(100, 50), pt(100, 390)]],
        [[pt(100, 61), pt(100, 410)], [pt(99.5, 52), pt(100, 380)]],
    ]
    assert pick_paired(rounds) == 1
    assert pick_paired(rounds, tie=0.0) == 0  # without the tie, the higher median share wins


def test_paired_rounds_need_the_same_candidates_in_every_round() -> None:
    with pytest.raises(ValueError, match="same candidates"):
        pick_paired([])
    with pytest.raises(ValueError, match="same candidates"):
        pick_paired([[[pt(1, 1)], [pt(1, 1)]], [[pt(1, 1)]]])


def test_the_report_names_each_broken_tie_its_choice_and_the_sweeps_own() -> None:
    tb = {
        "protocol": "grpc",
        "candidates": ["1 inst x 2 thr", "2 inst x 1 thr"],
        "rounds": [[[pt(20.0, 440)], [pt(21.0, 420)]], [[pt(20.5, 430)], [pt(20.5, 425)]]],
        "chosen": "2 inst x 1 thr",
        "sweep_pick": "1 inst x 2 thr",
    }
    text = tiebreak_text({"trtforge": {"tiebreaks": {"high": tb}}, "triton": {"tiebreaks": {}}})
    assert text.startswith("Ties broken in paired rounds:")
    line = text.splitlines()[1]
    assert "trtforge c>=8" in line and "2 paired rounds over gRPC" in line
    assert "[1 inst x 2 thr] 0.976" in line and "[2 inst x 1 thr] 1.000" in line
    assert "chosen [2 inst x 1 thr] (the sweep alone: [1 inst x 2 thr])" in line
    assert "triton" not in text
    failed = tiebreak_text(
        {
            "mlserver": {
                "tiebreaks": {"low": {"failed": "Traceback (most recent call last):\ndid not become ready\n"}}
            }
        }
    )
    assert "mlserver c<8: the tie-break failed, the sweep's pick stands (did not become ready)" in failed
    assert tiebreak_text({"kserve": {}}) == ""
