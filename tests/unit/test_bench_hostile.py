"""The front-door benchmark's verdicts against its quiet baseline (benchmarks/hostile.py)."""

from __future__ import annotations

from typing import Any

from trtforge_dev.hostile_run import FAMILIES

from benchmarks.hostile import FRONT_DOOR, front_door_verdicts

QUIET: dict[str, Any] = {"health_p99_ms": 10.0, "grpc_p50_ms": 2.0}


def _case(**kw: Any) -> dict[str, Any]:
    case: dict[str, Any] = {
        "health_p99_ms": 20.0,
        "http_success_rate": 1.0,
        "grpc_success_rate": 0.99,
        "rss_start_above_idle_mb": 10.0,
        "rss_peak_above_idle_mb": 40.0,
        "grpc_p50_ms": 3.0,
        "alive": True,
    }
    return case | kw


def test_a_case_within_every_target_meets_them_all() -> None:
    assert all(front_door_verdicts(_case(), QUIET).values())


def test_each_target_is_judged_against_the_same_runs_quiet_figures() -> None:
    assert not front_door_verdicts(_case(health_p99_ms=60.1), QUIET)["health"]  # 50 ms above quiet
    assert front_door_verdicts(_case(health_p99_ms=60.0), QUIET)["health"]
    assert not front_door_verdicts(_case(grpc_success_rate=0.94), QUIET)["legit"]  # either protocol
    assert not front_door_verdicts(_case(rss_peak_above_idle_mb=74.1), QUIET)["rss"]  # growth, not level
    grown = _case(rss_start_above_idle_mb=100.0, rss_peak_above_idle_mb=160.0)
    assert front_door_verdicts(grown, QUIET)["rss"]
    assert not front_door_verdicts(_case(grpc_p50_ms=4.1), QUIET)["grpc_p50"]  # 2x quiet
    assert not front_door_verdicts(_case(alive=False), QUIET)["alive"]


def test_every_case_is_an_attack_family_and_every_item_of_the_issue_has_one() -> None:
    assert set(FRONT_DOOR.values()) <= set(FAMILIES)
    assert {item for item, _ in FRONT_DOOR} == {1, 2, 3, 4, 5}


def test_the_proxy_run_is_shown_beside_the_server_alone_each_against_its_own_quiet() -> None:
    from benchmarks.hostile import render_front_door

    def run(proxy: str | None, quiet_p50: float, case_p50: float) -> dict[str, Any]:
        quiet = {**QUIET, "grpc_p50_ms": quiet_p50}
        case = _case(grpc_p50_ms=case_p50)
        met = front_door_verdicts(case, quiet)
        return {
            "front_proxy": proxy,
            "family_seconds": 8.0,
            "cpus": {"server": "0", "probe": "1", "attack": "1"},
            "quiet": quiet,
            "cases": [{"item": 1, "case": "short messages", "family": "short_messages", **case, "met": met}],
            "server_alive": True,
        }

    alone, behind = run(None, 2.0, 200.0), run("haproxy", 4.0, 6.0)
    text = render_front_door({**alone, "runs": {"server": alone, "haproxy": behind}})
    (row,) = [ln for ln in text.splitlines() if "short messages" in ln]
    assert "100.0x ✗ / 1.5x" in row  # each against its own run's quiet
    assert "behind haproxy" in text


def test_a_case_of_new_clients_is_judged_against_a_quiet_of_new_clients() -> None:
    from benchmarks.hostile import QUIET_FRESH, baseline_of, render_front_door_run

    assert baseline_of("slowloris_1100") == QUIET_FRESH  # its legitimate clients connect for every infer
    assert baseline_of("short_messages") == "quiet"
    fresh = {**QUIET, "grpc_p50_ms": 5.0}  # a new connection costs the infer its handshakes
    case = _case(grpc_p50_ms=8.0)
    res = {
        "front_proxy": "haproxy",
        "family_seconds": 8.0,
        "cpus": {"server": "0", "probe": "1", "attack": "1"},
        "serve_flags": [],
        "quiet": QUIET,
        QUIET_FRESH: fresh,
        "cases": [
            {"item": 3, "case": "slowloris", "family": "slowloris_1100", **case, "baseline": QUIET_FRESH}
            | {"met": front_door_verdicts(case, fresh)}
        ],
        "server_alive": True,
        "targets": {
            "health_p99_slack_ms": 50,
            "legit_success": 0.95,
            "rss_growth_mb": 64,
            "grpc_p50_ratio": 2,
        },
    }
    (row,) = [ln for ln in render_front_door_run(res).splitlines() if "slowloris" in ln]
    assert "1.6x" in row and "✗" not in row  # 8 ms against 5, where against the reused quiet it is 4x
