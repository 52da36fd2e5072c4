"""The targets table: which rows decide the issue's serving targets (a pure function of result files)."""

from __future__ import annotations

from typing import Any

from benchmarks.report import INFO, SHOWN, targets


def grid(best_peers: list[str], verdict: str = "loss", http_share: float = 88.0) -> dict[str, Any]:
    points = [
        {
            "concurrency": c,
            "ratio": 0.97,
            "best_peer": {"server": peer, "protocol": "http", "throughput": 100.0, "p99_ms": 10.0},
            "trtforge": {"protocol": "http", "throughput": 97.0, "p99_ms": 11.0, "pct_of_ceiling": 90.0},
            "verdict": verdict,
        }
        for c, peer in zip((1, 8, 32, 64), best_peers, strict=True)
    ]
    summary = {
        "points": points,
        "min_pct_of_ceiling_c_ge_8_http": http_share,
        "min_pct_of_ceiling_c_ge_8_grpc": 85.0,
        "grpc_vs_http_c32": 0.85,
    }
    return {"summary": {"squeezenet": summary}}


def paired_point(c: int, protocol: str, share: float, verdict: str = "win") -> dict[str, Any]:
    return {
        "concurrency": c,
        "protocol": protocol,
        "pct_of_ceiling": {"median": share, "min": share - 1},
        "paired_ratio": {"median": 1.05, "min": 1.0, "max": 1.1, "rounds_at_or_above": 5, "rounds": 5},
        "verdict": verdict,
    }


def paired(http_share: float = 92.0) -> dict[str, Any]:
    return {
        "peer": "triton",
        "models": {
            "squeezenet": {
                "best_protocol_points": [paired_point(c, "http", http_share) for c in (1, 8, 32, 64)],
                "points": [
                    paired_point(c, p, http_share - 3 * (p == "grpc"))
                    for c in (8, 32)
                    for p in ("http", "grpc")
                ],
                "trtforge_grpc_over_http_c32": {"median": 0.97, "rounds": [0.97] * 5},
            }
        },
    }


def rows(text: str) -> dict[str, str]:
    """target -> its status cell."""
    out = {}
    for line in text.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = cells[-1]
    return out


def test_the_paired_rounds_decide_where_they_measured_the_grids_best_peer() -> None:
    got = rows(targets(grid(["triton"] * 4), None, None, paired()))
    assert got["squeezenet: trtforge ≥ the best of Triton and MLServer, p99 no higher"] == SHOWN
    assert got["squeezenet: ≥ 90% of the ceiling at c ≥ 8 (http)"] == SHOWN
    assert got["squeezenet: gRPC within 10% of HTTP binary at c=32"] == SHOWN
    assert got["squeezenet: trtforge ≥ triton, p99 no higher (paired rounds)"] == "**met**"
    assert got["squeezenet: ≥ 90% of the ceiling at c ≥ 8 (http, paired rounds)"] == "**met**"
    assert got["squeezenet: gRPC within 10% of HTTP binary at c=32 (paired rounds)"] == "**met**"
    # gRPC's share is shown; its target is its ratio to HTTP binary
    assert got["squeezenet: ≥ 90% of the ceiling at c ≥ 8 (grpc, paired rounds)"] == INFO
    assert got["squeezenet: ≥ 90% of the ceiling at c ≥ 8 (grpc)"] == INFO


def test_a_paired_miss_is_a_miss() -> None:
    got = rows(targets(grid(["triton"] * 4), None, None, paired(http_share=89.9)))
    assert got["squeezenet: ≥ 90% of the ceiling at c ≥ 8 (http, paired rounds)"] == "**missed**"


def test_the_grid_decides_where_another_peer_led_or_there_were_no_paired_rounds() -> None:
    # MLServer led at c=1: the paired rounds (against Triton) did not measure the best peer there
    got = rows(targets(grid(["mlserver", "triton", "triton", "triton"]), None, None, paired()))
    assert got["squeezenet: trtforge ≥ the best of Triton and MLServer, p99 no higher"] == "**missed**"
    assert got["squeezenet: ≥ 90% of the ceiling at c ≥ 8 (http)"] == "**missed**"
    assert got["squeezenet: gRPC within 10% of HTTP binary at c=32"] == "**missed**"
    alone = rows(targets(grid(["triton"] * 4, verdict="win", http_share=91.0), None, None, None))
    assert alone["squeezenet: trtforge ≥ the best of Triton and MLServer, p99 no higher"] == "**met**"
    assert alone["squeezenet: ≥ 90% of the ceiling at c ≥ 8 (http)"] == "**met**"
