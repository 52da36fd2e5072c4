"""The targets table of docs/benchmarks.md: which rows are met (a pure function of result files)."""

from __future__ import annotations

from typing import Any

from benchmarks.report import targets

VERDICT_ROW = "squeezenet: trtforge ≥ the best of Triton and MLServer, p99 no higher"
SHARE_ROW = "squeezenet: ≥ 90% of the ceiling at c ≥ 8 (HTTP binary)"
GRPC_ROW = "squeezenet: gRPC within 10% of HTTP binary at c=32"


def serving(verdicts: list[str], http_shares: list[float], grpc_c32: float | None) -> dict[str, Any]:
    concs = (1, 8, 32)
    http = [
        {"protocol": "http", "concurrency": c, "throughput": share, "pct_of_ceiling": share}
        for c, share in zip(concs, http_shares, strict=True)
    ]
    grpc = [] if grpc_c32 is None else [{"protocol": "grpc", "concurrency": 32, "throughput": grpc_c32}]
    summary = [
        {
            "concurrency": c,
            "ratio": 1.01,
            "best_peer": {"server": "triton"},
            "verdict": v,
        }
        for c, v in zip(concs, verdicts, strict=True)
    ]
    return {
        "models": {"squeezenet": {"servers": {"trtforge": {"points": [*http, *grpc]}}}},
        "summary": {"squeezenet": {"points": summary}},
    }


def rows(text: str) -> dict[str, str]:
    """target -> its status cell."""
    out = {}
    for line in text.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        out[cells[0]] = cells[-1]
    return out


def test_every_point_must_win_or_tie_and_every_high_point_reach_90_percent() -> None:
    met = rows(
        targets(
            serving(["win", "tie (5% band near the ceiling)", "win"], [70.0, 90.0, 95.0], 93.0), None, None
        )
    )
    assert met[VERDICT_ROW] == "**met**"
    assert met[SHARE_ROW] == "**met**"  # c=1's 70% is no part of the target
    assert met[GRPC_ROW] == "**met**"  # 93 / 95 = 0.98
    missed = rows(targets(serving(["win", "win, p99 higher", "win"], [70.0, 89.9, 95.0], 85.0), None, None))
    assert missed[VERDICT_ROW] == "**missed**"
    assert missed[SHARE_ROW] == "**missed**"
    assert missed[GRPC_ROW] == "**missed**"  # 85 / 95 = 0.89


def test_without_grpc_points_there_is_no_grpc_row() -> None:
    got = rows(targets(serving(["win"] * 3, [70.0, 90.0, 95.0], None), None, None))
    assert GRPC_ROW not in got and VERDICT_ROW in got
    assert targets(None, None, None) == "(no results)"


def test_trtforge_against_triton_over_each_protocol_at_every_concurrency() -> None:
    """HTTP at least 0.95x Triton's HTTP and gRPC at least 0.85x Triton's gRPC, at every concurrency
    both servers have; the lowest point decides."""

    def run(http: list[float], grpc: list[float]) -> dict[str, str]:
        result = serving(["win"] * 3, [90.0, 90.0, 90.0], None)
        servers = result["models"]["squeezenet"]["servers"]
        servers["trtforge"]["points"] = [
            {"protocol": p, "concurrency": c, "throughput": t, "pct_of_ceiling": 90.0}
            for p, ts in (("http", http), ("grpc", grpc))
            for c, t in zip((1, 8, 32), ts, strict=True)
        ]
        servers["triton"] = {
            "points": [
                {"protocol": p, "concurrency": c, "throughput": 100.0}
                for p in ("http", "grpc")
                for c in (1, 8, 32)
            ]
        }
        return rows(targets(result, None, None))

    http_row = "squeezenet: trtforge HTTP binary ≥ 0.95x Triton's HTTP binary at every concurrency"
    grpc_row = "squeezenet: trtforge gRPC ≥ 0.85x Triton's gRPC at every concurrency"
    met = run([200.0, 95.0, 100.0], [150.0, 85.0, 90.0])
    assert met[http_row] == "**met**" and met[grpc_row] == "**met**"
    missed = run([200.0, 94.9, 100.0], [150.0, 90.0, 84.9])
    assert missed[http_row] == "**missed**" and missed[grpc_row] == "**missed**"
    assert http_row not in rows(targets(serving(["win"] * 3, [90.0] * 3, None), None, None))  # no Triton


def test_each_protocol_and_concurrency_on_the_most_cores_is_a_many_core_row_of_its_own() -> None:
    def run(n: int, protocol: str, conc: int, share: float, errors: int = 0) -> dict[str, Any]:
        return {
            "model": "squeezenet",
            "n": n,
            "protocol": protocol,
            "concurrency": conc,
            "setting": "default",
            "errors": errors,
            "round_shares": {"median": share},
        }

    manycore = {
        "runs": [
            run(8, "http", 28, 40.0),  # fewer cores: not a target row
            run(14, "http", 28, 86.0),
            run(14, "grpc", 28, 84.9),
            run(14, "http", 56, 90.0, errors=1),
            run(14, "grpc", 56, 85.0),
        ]
    }
    got = {k: v for k, v in rows(targets(None, None, manycore)).items() if "server cores" in k}
    row = "squeezenet: ≥ 85% of the same-run ceiling on 14 server cores, {} at c={}"
    assert got == {
        row.format("http", 28): "**met**",
        row.format("grpc", 28): "**missed**",
        row.format("http", 56): "**missed**",  # a point with errors misses, whatever its share
        row.format("grpc", 56): "**met**",
    }
