"""The serving benchmark's verdicts: each point against the ceiling and trtforge against the best peer
(pure functions of perf_analyzer's numbers)."""

from __future__ import annotations

from typing import Any

from benchmarks.serving import MET_VERDICTS, TIE, WIN, ceil_pct, reachable_share, summarize, verdict


def pt(throughput: float, p99_ms: float) -> dict[str, Any]:
    return {"throughput": throughput, "p99_ms": p99_ms}


def test_each_point_is_judged_against_the_models_ceiling() -> None:
    def point(c: int, throughput: float) -> dict[str, Any]:
        return {"protocol": "http", "concurrency": c, "throughput": throughput, "p99_ms": 100.0}

    mres = {
        "ceiling": {"best": {"images_per_s": 250.0}},
        "servers": {
            "trtforge": {"points": [point(8, 225.0), point(32, 240.0)]},
            "triton": {"points": [point(8, 230.0), point(32, 200.0)]},
        },
    }
    ceil_pct(mres)
    shares = {p["concurrency"]: p["pct_of_ceiling"] for p in mres["servers"]["trtforge"]["points"]}
    assert shares == {8: 90.0, 32: 96.0}
    got = summarize({"models": {"squeezenet": mres}})["squeezenet"]["points"]
    # 225 is within 5% of 230, but neither is within 5% of the ceiling (250): no band, a loss
    assert [(p["concurrency"], p["verdict"]) for p in got] == [(8, "loss"), (32, WIN)]
    assert got[1]["best_peer"]["server"] == "triton" and got[1]["ratio"] == 1.2


def test_trtforge_is_set_against_the_best_peer_at_each_protocols_best() -> None:
    def point(protocol: str, throughput: float, p99: float) -> dict[str, Any]:
        return {"protocol": protocol, "concurrency": 8, "throughput": throughput, "p99_ms": p99}

    mres = {
        "ceiling": {"best": {"images_per_s": 100.0}},
        "servers": {
            "trtforge": {"points": [point("http", 90.0, 50.0), point("grpc", 97.0, 40.0)]},
            "triton": {"points": [point("http", 95.0, 45.0)]},
            "mlserver": {"points": [point("grpc", 96.0, 44.0), point("json", 60.0, 90.0)]},
            "kserve": {"points": [point("http", 99.0, 10.0)]},  # not a peer to beat
        },
    }
    ceil_pct(mres)
    (got,) = summarize({"models": {"m": mres}})["m"]["points"]
    assert got["trtforge"]["protocol"] == "grpc" and got["trtforge"]["throughput"] == 97.0
    assert got["best_peer"] == {"server": "mlserver", "protocol": "grpc", "throughput": 96.0, "p99_ms": 44.0}
    assert got["verdict"] == WIN


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


# ResNet-50's ceiling run on a 2-core host (img/s)
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
