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
