"""Leader election's pure decisions (trtforge_operator.leader.lease), after client-go's semantics."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from trtforge_operator.config import ConfigError, LeaderElectionSettings, load_config
from trtforge_operator.leader.lease import (
    LeaseRecord,
    Observed,
    Verdict,
    jittered,
    next_record,
    observe,
    released,
    renew_in_place,
    still_leading,
    timing_problem,
    verdict,
)

T0 = datetime(2026, 11, 30, 10, 0, 0, 123456, tzinfo=UTC)


def rec(holder: str = "b", duration: int = 15, transitions: int = 0, t: datetime = T0) -> LeaseRecord:
    return LeaseRecord(holder, duration, t, t, transitions)


def test_spec_round_trip_uses_microtime() -> None:
    r = rec("pod-a", transitions=3)
    spec = r.to_spec()
    assert spec["renewTime"] == "2026-11-30T10:00:00.123456Z"
    assert spec["holderIdentity"] == "pod-a" and spec["leaseTransitions"] == 3
    assert LeaseRecord.from_spec(spec) == r


def test_from_spec_of_an_empty_lease() -> None:
    assert LeaseRecord.from_spec(None) == LeaseRecord("", 0, None, None, 0)


def test_no_lease_means_create() -> None:
    assert verdict("a", None, now=100.0) is Verdict.CREATE


def test_own_lease_is_renewed_even_when_old() -> None:
    assert verdict("a", Observed(rec("a"), since=0.0), now=1000.0) is Verdict.RENEW


def test_released_lease_is_taken_at_once() -> None:
    assert verdict("a", Observed(rec(""), since=100.0), now=100.0) is Verdict.TAKE_OVER


@pytest.mark.parametrize(
    ("now", "expected"), [(100.0, Verdict.WAIT), (114.9, Verdict.WAIT), (115.0, Verdict.TAKE_OVER)]
)
def test_another_holder_is_waited_out_for_a_lease_duration_of_our_own_clock(
    now: float, expected: Verdict
) -> None:
    assert verdict("a", Observed(rec("b", duration=15), since=100.0), now=now) is expected


def test_a_renewing_holder_keeps_restarting_the_clock() -> None:
    seen = observe(None, rec("b"), now=100.0)
    assert observe(seen, rec("b"), now=110.0) is seen  # unchanged: the clock runs on
    renewed = rec("b", t=T0.replace(second=2))
    seen2 = observe(seen, renewed, now=110.0)
    assert seen2.since == 110.0
    assert verdict("a", seen2, now=120.0) is Verdict.WAIT  # 10 s after the renew was seen


def test_the_holders_wall_clock_does_not_matter() -> None:
    """A renewTime far in the past (skewed clock) is no reason to take over: only our own clock counts."""
    seen = observe(None, rec("b", t=datetime(2001, 1, 1, tzinfo=UTC)), now=50.0)
    assert verdict("a", seen, now=51.0) is Verdict.WAIT


def test_next_record() -> None:
    cur = rec("b", transitions=4)
    later = T0.replace(minute=5)
    assert next_record(Verdict.WAIT, "a", cur, later, 15) is None
    assert next_record(Verdict.CREATE, "a", None, later, 15) == LeaseRecord("a", 15, later, later, 0)
    taken = next_record(Verdict.TAKE_OVER, "a", cur, later, 20)
    assert taken == LeaseRecord("a", 20, later, later, 5)
    mine = rec("a", transitions=4)
    renewed = next_record(Verdict.RENEW, "a", mine, later, 15)
    assert renewed == LeaseRecord("a", 15, T0, later, 4)  # acquireTime and transitions stay


def test_released_keeps_transitions_and_expires_at_once() -> None:
    r = released(rec("a", transitions=2), T0)
    assert r.holder == "" and r.duration_s == 1 and r.transitions == 2


@pytest.mark.parametrize(("now", "leading"), [(100.0, True), (109.99, True), (110.0, False), (200.0, False)])
def test_still_leading_counts_from_when_the_renew_was_sent(now: float, leading: bool) -> None:
    assert still_leading(now, last_renew_sent=100.0, renew_deadline_s=10.0) is leading


def test_never_renewed_is_not_leading() -> None:
    assert still_leading(0.0, None, 10.0) is False


def test_holder_stops_before_a_candidate_can_take_over() -> None:
    """The invariant: a renew sent at t is seen by a candidate at >= t, so it takes over at >= t + 15,
    while the holder stopped at t + 10 at the latest."""
    s = LeaderElectionSettings()
    sent, seen_at = 100.0, 100.0
    holder_stops = sent + s.renew_deadline_seconds
    seen = Observed(rec("b", duration=s.lease_duration_seconds), since=seen_at)
    first_take_over = next(
        t / 10 for t in range(1000, 3000) if verdict("a", seen, now=t / 10) is Verdict.TAKE_OVER
    )
    assert not still_leading(holder_stops, sent, s.renew_deadline_seconds)
    assert holder_stops < first_take_over


def test_jitter_stays_within_client_gos_factor() -> None:
    assert jittered(2.0, 0.0) == 2.0
    assert 2.0 <= jittered(2.0, 0.999) < 2.4


def test_defaults_are_client_gos() -> None:
    s = LeaderElectionSettings()
    assert (s.lease_duration_seconds, s.renew_deadline_seconds, s.retry_period_seconds) == (15, 10.0, 2.0)
    assert s.enabled


@pytest.mark.parametrize(
    ("d", "r", "p", "needle"),
    [(10, 10.0, 2.0, "must be greater than renew_deadline_seconds"), (15, 2.0, 2.0, "1.2 x retry_period")],
)
def test_timing_problems(d: int, r: float, p: float, needle: str) -> None:
    problem = timing_problem(d, r, p)
    assert problem is not None and needle in problem
    assert timing_problem(15, 10, 2) is None


def test_config_refuses_inconsistent_timings_naming_the_field(tmp_path: object) -> None:
    from pathlib import Path

    p = Path(str(tmp_path)) / "c.yaml"
    p.write_text("leader_election:\n  lease_duration_seconds: 8\n  renew_deadline_seconds: 10\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, env={})
    assert "leader_election" in str(e.value) and "renew_deadline_seconds" in str(e.value)


@pytest.mark.parametrize(
    ("seen_holder", "rv", "leading", "in_place"),
    [
        ("a", "7", True, True),  # our own record, its resourceVersion, within the deadline: one update
        ("a", "7", False, False),  # past the renew deadline: never renew blindly
        ("a", None, True, False),  # no resourceVersion to guard the write with
        ("b", "7", True, False),  # the last record we saw is another holder's
        (None, "7", True, False),  # we have seen no record
    ],
)
def test_renew_in_place_only_for_a_leader_holding_its_own_record(
    seen_holder: str | None, rv: str | None, leading: bool, in_place: bool
) -> None:
    """client-go's fast path: a single update on the cached resourceVersion instead of read + write."""
    seen = None if seen_holder is None else Observed(rec(seen_holder), 0.0)
    assert renew_in_place("a", seen, rv, leading) is in_place
