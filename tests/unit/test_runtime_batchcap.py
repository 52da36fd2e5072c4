"""The learned batch cap: the pure decision over per-row timings, the moving averages that feed it, and
the batcher capping its batches by what it learned from its own (real) batch timings."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable

import numpy as np
import pytest
from trtforge_runtime.serving import batcher
from trtforge_runtime.serving.batchcap import (
    MAX_REFRESH_EVERY,
    MIN_SAMPLES,
    REFRESH_EVERY,
    WINDOW,
    BatchCap,
    Probe,
    bucket,
    learned_cap,
    median_and_error,
    median_error,
    probe_limit,
    refresh_interval,
)
from trtforge_runtime.serving.batcher import Batcher
from trtforge_runtime.serving.metrics import Metrics

from tests.unit.test_runtime_batcher_events import until


def test_buckets_are_the_power_of_two_at_or_below() -> None:
    assert [bucket(r) for r in (1, 2, 3, 4, 7, 8, 15, 16, 33)] == [1, 2, 2, 4, 4, 8, 8, 16, 32]


def test_until_two_buckets_are_timed_the_cap_starts_at_two_and_climbs_to_time_the_next() -> None:
    assert learned_cap({}, 32) == 2 and learned_cap({}, 1) == 1
    assert learned_cap({1: 0.007}, 32) == 2
    assert learned_cap({4: 0.007}, 32) == 8
    assert learned_cap({16: 0.007}, 24) == 24  # never past the max
    assert learned_cap({64: 0.001, 1: 0.007}, 32) == 2  # a bucket above the max batch does not count
    assert BatchCap(32).limit == 2 and BatchCap(1).limit == 1


def test_flat_per_row_times_cap_at_twice_the_smallest_bucket_within_tolerance() -> None:
    # A CPU session: rows cost the same (or more) in bigger batches.
    cpu = {1: 0.0070, 2: 0.0069, 4: 0.0071, 8: 0.0074, 16: 0.0075}
    assert learned_cap(cpu, 32) == 2
    # Batch 1 is 6% slower per row than the best (2): 2 is the smallest that is as good.
    assert learned_cap({1: 0.0074, 2: 0.0070, 4: 0.0071}, 32) == 4


def test_per_row_times_that_keep_falling_keep_the_cap_climbing() -> None:
    # A GPU engine: each bucket computes a row faster than the one below it.
    assert learned_cap({1: 1.0, 2: 0.5}, 64) == 4
    assert learned_cap({1: 1.0, 2: 0.5, 4: 0.26}, 64) == 8
    assert learned_cap({1: 1.0, 2: 0.5, 4: 0.26, 8: 0.13, 16: 0.07, 32: 0.04}, 64) == 64
    assert learned_cap({1: 1.0, 2: 0.5, 4: 0.26, 8: 0.13, 16: 0.07}, 24) == 24  # never past the max


def test_the_tolerance_is_what_counts_as_as_good() -> None:
    times = {1: 0.0104, 2: 0.0100}
    assert learned_cap(times, 32) == 2  # 4% slower: as good
    assert learned_cap(times, 32, tolerance=0.03) == 4


def test_the_cap_in_force_holds_near_the_edge() -> None:
    # Bucket 4 is 4.9% slower per row than 8, then 5.1%: without the current cap the choice flips.
    edge_in, edge_out = {4: 8.27, 8: 7.88}, {4: 8.29, 8: 7.88}
    assert (learned_cap(edge_in, 32), learned_cap(edge_out, 32)) == (8, 16)
    assert learned_cap(edge_in, 32, current=16) == 16  # 4 is not within half the tolerance
    assert learned_cap(edge_out, 32, current=8) == 8  # 4 is still within twice the tolerance
    # Past the bands it moves: 4 clearly as good, or 4 more than 10% slower.
    assert learned_cap({4: 7.9, 8: 7.88}, 32, current=16) == 8
    assert learned_cap({4: 8.8, 8: 7.88}, 32, current=8) == 16
    # The smallest of the clearly-as-good buckets, not the next one down.
    assert learned_cap({1: 7.9, 2: 7.9, 4: 7.9, 8: 7.88}, 32, current=16) == 2
    # A current cap whose bucket was never timed (the max batch at first) does not hold.
    assert learned_cap({1: 1.0, 2: 0.5}, 24, current=24) == 4


def test_the_median_error_follows_the_spread_and_ignores_the_odd_batch() -> None:
    assert median_error([]) == median_error([0.007]) == 0.0
    assert median_error([0.007] * 16) == 0.0
    tight, loose = [0.0070, 0.0071] * 8, [0.0060, 0.0080] * 8
    assert 0 < median_error(tight) < median_error(loose)
    assert median_error([*tight[:-1], 0.5]) == pytest.approx(median_error(tight), rel=0.5)


@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_one_pass_median_and_error_equal_the_statistics_modules(n: int) -> None:
    values = [((i * 7919) % 23 + 0.5 * (i % 3)) * 1e-4 for i in range(n)]  # unsorted, with ties
    mid = statistics.median(values)
    mad = statistics.median(abs(v - mid) for v in values)
    error = 1.2533 * 1.4826 * mad / math.sqrt(n) if n > 1 else 0.0
    assert median_and_error(values) == (mid, pytest.approx(error, rel=1e-12))
    assert median_and_error(iter(values))[0] == mid  # any iterable, a deque included


def test_buckets_within_their_noise_are_as_good_so_the_smaller_wins() -> None:
    # 1 row is 10% slower per row than 2: past the tolerance, so a precise timing caps at 4 ...
    times = {1: 0.088, 2: 0.080, 4: 0.081}
    assert learned_cap(times, 32, error={1: 0.0005, 2: 0.0005, 4: 0.0005}) == 4
    # ... and a noisy one (a 10% gap well inside two standard errors of the difference) at 2.
    assert learned_cap(times, 32, error={1: 0.004, 2: 0.003, 4: 0.003}) == 2
    # A GPU-like bigger batch, faster by far more than its noise, still wins.
    gpu = {1: 1.0, 2: 0.5, 4: 0.26}
    assert learned_cap(gpu, 64, error={1: 0.05, 2: 0.03, 4: 0.02}) == 8


def test_probes_time_the_buckets_below_the_cap() -> None:
    # Nothing below the cap timed: every other batch probes the smallest untimed of the two below,
    # whether a re-timing is due or not.
    assert [probe_limit(32, set(), n, None) for n in range(1, 5)] == [Probe(8, False), None] * 2
    assert probe_limit(32, set(), 1, 3) == Probe(8, refresh=False)
    assert probe_limit(32, {8}, 1, None) == Probe(16, refresh=False)
    assert probe_limit(24, set(), 1, None) == Probe(4, False)  # 24's bucket is 16
    assert probe_limit(2, set(), 1, None) == Probe(1, False) and probe_limit(1, set(), 1, 0) is None
    # Both timed: nothing unless a re-timing is due; then they take turns.
    timed = {8, 16}
    assert [probe_limit(32, timed, n, None) for n in range(1, 2 * REFRESH_EVERY)] == [None] * (
        2 * REFRESH_EVERY - 1
    )
    assert [probe_limit(32, timed, 7, turn) for turn in range(4)] == [Probe(8, True), Probe(16, True)] * 2


def test_re_timings_come_further_apart_while_the_cap_holds() -> None:
    waits = [refresh_interval(n) for n in range(8)]
    assert waits[:3] == [REFRESH_EVERY, 2 * REFRESH_EVERY, 4 * REFRESH_EVERY]
    assert waits[-1] == MAX_REFRESH_EVERY and refresh_interval(10_000) == MAX_REFRESH_EVERY
    assert all(a <= b for a, b in itertools.pairwise(waits))


def _steady(cap: BatchCap, seconds: Callable[[int], float], batches: int) -> list[int]:
    """A load that fills every batch: each batch has as many rows as the cap allows; the sizes."""
    sizes = []
    for _ in range(batches):
        rows = cap.probe(cap.limit)
        sizes.append(rows)
        cap.observe(rows, seconds(rows))
    return sizes


def test_a_load_that_fills_every_batch_still_learns_that_small_batches_do_as_well() -> None:
    # Without the probes every batch has max-batch rows: one bucket, and the cap never moves.
    cap = BatchCap(32)
    _steady(cap, lambda rows: 0.08 * rows, 400)  # flat per-row cost (ResNet-50 on a CPU)
    assert cap.limit == 2, cap.per_row_ms()
    assert set(cap.per_row_ms()) >= {1, 2}


def test_a_load_that_fills_every_batch_keeps_the_max_where_bigger_batches_are_faster() -> None:
    cap = BatchCap(64)
    sizes = _steady(cap, lambda rows: 0.010 + 0.001 * rows, 40 * REFRESH_EVERY)  # GPU-like
    assert cap.limit == 64, cap.per_row_ms()
    late = sizes[-10 * REFRESH_EVERY :]  # past the first probes: a re-timing now and then
    assert 1 <= sum(1 for rows in late if rows < 64) <= 3, late


def _probe_gaps(sizes: list[int], full: int) -> list[int]:
    at = [i for i, rows in enumerate(sizes) if rows < full]
    return [b - a for a, b in itertools.pairwise(at)]


def test_a_steady_cap_is_re_timed_less_and_less_often_and_soon_again_once_it_moves() -> None:
    # A CPU session under a load that fills every batch: each probe costs the queue a fuller batch,
    # so once the buckets below are timed the re-timings come further apart ...
    cap = BatchCap(4)
    sizes = _steady(cap, lambda rows: 0.04 * rows, 8 * MAX_REFRESH_EVERY)  # flat per-row cost
    assert cap.limit == 2, cap.per_row_ms()
    settled = _probe_gaps(sizes, 2)[MIN_SAMPLES:]  # past every other batch while 1 was untimed
    assert settled[:3] == [REFRESH_EVERY, 2 * REFRESH_EVERY, 4 * REFRESH_EVERY], settled
    assert settled[-1] == MAX_REFRESH_EVERY
    assert sum(1 for rows in sizes[-4 * MAX_REFRESH_EVERY :] if rows < 2) == 4
    # ... until the timings move the cap (batches of 2 now compute a row in half the time): the
    # buckets below the new cap are re-timed within REFRESH_EVERY batches of the move.
    moved_at, probes_after = None, []
    for n in range(4 * REFRESH_EVERY):
        rows = cap.probe(cap.limit)
        if moved_at is not None and rows < cap.limit:
            probes_after.append(n - moved_at)
        if cap.observe(rows, 0.04 * rows if rows == 1 else 0.02 * rows) and moved_at is None:
            moved_at = n
    assert cap.limit == 4 and moved_at is not None, cap.per_row_ms()
    assert probes_after and probes_after[0] <= REFRESH_EVERY, probes_after


def _feed(cap: BatchCap, rows: int, per_row: float, n: int = MIN_SAMPLES) -> bool:
    changed = False
    for _ in range(n):
        changed = cap.observe(rows, rows * per_row) or changed
    return changed


def test_a_bucket_counts_once_it_has_enough_batches() -> None:
    cap = BatchCap(32)
    assert not _feed(cap, 2, 0.0035, MIN_SAMPLES - 1)
    assert cap.limit == 2 and cap.per_row_ms() == {}
    assert cap.observe(2, 2 * 0.0035)  # the eighth: bucket 2 timed, so the cap climbs to time 4
    assert cap.limit == 4 and cap.per_row_ms() == {2: 3.5}
    assert not _feed(cap, 16, 0.0075, MIN_SAMPLES - 1)
    assert not cap.observe(16, 16 * 0.0075)  # two buckets to compare: 16 is slower, 4 stays
    assert cap.limit == 4
    assert cap.per_row_ms() == {2: 3.5, 16: 7.5}


def test_the_cap_climbs_again_when_the_bucket_above_gets_faster() -> None:
    cap = BatchCap(32)
    _feed(cap, 1, 0.007)
    _feed(cap, 8, 0.0075)
    assert cap.limit == 2
    _feed(cap, 2, 0.0035, 40)  # batches of 2 now compute a row in half the time
    assert cap.limit == 4
    _feed(cap, 3, 0.0035, 1)  # 3 rows is bucket 2
    assert cap.limit == 4


def test_one_slow_batch_moves_nothing() -> None:
    # A batch of one that waited for the GIL, say: a bucket's time is the median of its last batches.
    cap = BatchCap(32)
    _feed(cap, 1, 0.007)
    _feed(cap, 8, 0.0075)
    assert cap.limit == 2
    assert not cap.observe(1, 0.070)
    assert cap.limit == 2 and cap.per_row_ms()[1] == 7.0
    _feed(cap, 1, 0.070, WINDOW // 2 + 1)  # most of the window slow: that is the bucket's time now
    assert cap.limit == 16 and cap.per_row_ms()[1] == 70.0


def test_no_learning_without_batching_or_when_turned_off() -> None:
    off = BatchCap(32, learn=False)
    assert not _feed(off, 1, 0.007) and not _feed(off, 16, 0.01)
    assert off.limit == 32 and off.per_row_ms() == {}
    unbatched = BatchCap(0)
    assert not _feed(unbatched, 1, 0.007)
    assert unbatched.limit == 0


def gauge(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("trtforge_runtime_batch_cap", {"model": "m"})


class _Sleeps:
    """A session whose batches cost 6 ms plus 1 ms a row up to 8 rows, and 1.9 ms a row beyond: each
    row gets cheaper up to batches of 8, and batches of 16 cost more per row than batches of 8 (the
    batcher's input: what it learns from is how long its real calls take)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(inputs["x"])
        self.sizes.append(rows)
        time.sleep(0.006 + 0.001 * rows if rows <= 8 else 0.0019 * rows)
        return {"y": inputs["x"] + 1}


@pytest.mark.asyncio
async def test_the_batcher_climbs_from_small_batches_until_its_own_timings_stop_improving(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="trtforge_runtime.serving.batcher")
    # One log line per interval: an interval longer than any run keeps the count off the clock.
    monkeypatch.setattr(batcher, "CAP_LOG_INTERVAL_S", 1e9)
    sizes: list[int] = []
    metrics = Metrics("m")
    b = Batcher([_Sleeps(sizes), _Sleeps(sizes)], 32, 0.0, 256, metrics, lambda e: None)
    assert b.cap.limit == 2 and gauge(metrics) == 2  # it starts small
    b.start()
    try:
        x = np.zeros((1, 4), np.float32)
        bursts = 0
        while bursts < 200 and b.cap.limit != 16:  # bursts of 48: a share of 24 for each instance
            bursts += 1
            outs = await asyncio.gather(*(b.enqueue({"x": x + i}, 1) for i in range(48)))
            for i, o in enumerate(outs):
                np.testing.assert_array_equal(o["y"], x + i + 1)
        # Twice the smallest bucket as fast per row as the best: 8 (16 costs more per row).
        assert b.cap.limit == 16, (bursts, b.cap.per_row_ms())
        # The cap reaches 16 as soon as 8 is timed: keep the load on until 16 is timed too (the cap
        # may have changed on a burst's last batch, before any batch of 16 ran).
        while bursts < 200 and 16 not in b.cap.per_row_ms():
            bursts += 1
            await asyncio.gather(*(b.enqueue({"x": x + i}, 1) for i in range(48)))
        # Timed, 16 costs more per row than 8, so the cap holds: it climbed one bucket at a time and
        # never ran a batch past the first size that stopped paying.
        assert b.cap.limit == 16 and 16 in b.cap.per_row_ms(), (bursts, b.cap.per_row_ms())
        assert max(sizes) == 16, sizes
        # (a batch's answers reach the loop just before its timing reaches the cap and the gauge)
        await until(lambda: gauge(metrics) == b.cap.limit, "the gauge shows the learned cap")
        # The first change is logged with the timings behind it; later ones within the interval are not.
        lines = [r for r in caplog.records if r.getMessage() == "batch cap"]
        assert len(lines) == 1, lines
        logged = lines[0].trtforge_fields  # type: ignore[attr-defined]  (trtforge.logs.fields)
        assert logged["limit"] == 4 and logged["changes"] == 1 and logged["per_row_ms"], logged
    finally:
        await b.stop()


@pytest.mark.asyncio
async def test_a_fixed_cap_batches_up_to_the_max_batch() -> None:
    sizes: list[int] = []
    b = Batcher([_Sleeps(sizes), _Sleeps(sizes)], 32, 0.0, 256, Metrics("m"), lambda e: None, learn_cap=False)
    b.start()
    try:
        x = np.zeros((1, 4), np.float32)
        for _ in range(10):
            await asyncio.gather(*(b.enqueue({"x": x}, 1) for _ in range(48)))
        assert b.cap.limit == 32 and max(sizes) > 2, sizes
    finally:
        await b.stop()
