"""The batch cap a pool learns from its own batch timings (docs/design.md, "Learning the batch cap").

A bigger batch is worth its latency only while it computes each row faster: every request of a batch
waits for the batch's last row. The pool times its batches by size bucket (powers of two) and caps
its batches at twice the smallest bucket whose time per row is as good as the best bucket's: within
``TOLERANCE`` of it, or within the noise of the two buckets' timings (a bigger batch must be faster
by more than its noise to be worth its latency). The bucket above the choice keeps being timed, so
when it gets faster (a GPU engine, a quieter machine) the cap climbs again; the buckets below it are
*probed*: some batches are capped lower on purpose, so that under a load that fills every batch the
pool still learns whether smaller batches would do as well; once they are timed, the re-timings
come further apart while they leave the cap where it is (under a load that fills every batch,
each probe is one more, smaller batch). The cap starts at 2 and climbs a bucket
at a time (twice the one bucket timed, until there are two to compare): batches grow only where
the pool has seen them pay, so a fresh runtime never serves its first seconds in batches of the
max. The choice in force holds while its bucket stays within twice the tolerance and no smaller
bucket comes within half of it, so timings near the edge do not flip the cap back and forth.

:func:`learned_cap` and :func:`probe_limit` decide; :class:`BatchCap` keeps the timings and applies
them.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Container, Iterable, Mapping
from typing import NamedTuple

TOLERANCE = 0.05  # per-row times within 5% of the best are as good as the best
NOISE_Z = 2.0  # ... and so are those within this many standard errors of the difference
MIN_SAMPLES = 8  # batches a bucket needs before its time counts
WINDOW = 16  # a bucket's time is the median of its last WINDOW batches (one slow batch moves nothing)
# With the buckets below the cap timed, the first re-timing of one of them comes this many batches
# later; the wait doubles after each re-timing that leaves the cap where it was, up to the most.
REFRESH_EVERY = 32
MAX_REFRESH_EVERY = 1024


def bucket(rows: int) -> int:
    """The power of two at or below `rows` (rows >= 1)."""
    return 1 << (rows.bit_length() - 1)


def _middle(ordered: list[float]) -> float:
    """The median of values already sorted (at least one), as ``statistics.median`` has it."""
    h = len(ordered) // 2
    return ordered[h] if len(ordered) % 2 else (ordered[h - 1] + ordered[h]) / 2


def median_and_error(values: Iterable[float]) -> tuple[float, float]:
    """The median of `values` (at least one) and its standard error, from their median absolute
    deviation: robust to the odd slow batch, as the median itself is; 0 for a single value. Two
    sorts and no more: the pool calls it after every batch, under the batcher's lock."""
    ordered = sorted(values)
    mid = _middle(ordered)
    if len(ordered) < 2:
        return mid, 0.0
    sigma = 1.4826 * _middle(sorted([abs(v - mid) for v in ordered]))  # MAD to sigma, for normal data
    return mid, 1.2533 * sigma / math.sqrt(len(ordered))  # the median's sigma is sqrt(pi/2) the mean's


def median_error(values: list[float]) -> float:
    """The standard error of the median of `values` (seconds) (:func:`median_and_error`); 0 for
    fewer than two values."""
    return median_and_error(values)[1] if values else 0.0


def learned_cap(
    per_row: Mapping[int, float],
    max_batch: int,
    current: int | None = None,
    tolerance: float = TOLERANCE,
    error: Mapping[int, float] | None = None,
) -> int:
    """The batch cap for `per_row` (seconds per row by bucket, timed buckets only): twice the
    smallest bucket as good as the best bucket, at most `max_batch` (and at least 1); with no bucket
    timed, as if bucket 1 were (2). As good: within `tolerance` of the best per-row time, or
    within ``NOISE_Z`` standard errors of the difference (`error`: each bucket's, seconds; none
    known, none counted).

    With the `current` cap's bucket (half of it) timed and within twice that margin, it stays,
    unless smaller buckets come within half of it (then the smallest of those)."""
    known = {b: t for b, t in per_row.items() if b <= max_batch}
    if max_batch < 1:
        return max_batch
    if len(known) < 2:  # nothing to compare yet: time the bucket above
        return max(1, min(max_batch, 2 * min(known, default=1)))
    errors = error or {}
    best_bucket = min(known, key=lambda b: (known[b], b))
    best = known[best_bucket]

    def within(b: int, share: float) -> bool:
        noise = NOISE_Z * math.hypot(errors.get(b, 0.0), errors.get(best_bucket, 0.0))
        return known[b] <= best + share * (tolerance * best + noise)

    enough = min(b for b in known if within(b, 1.0))
    held = current // 2 if current else 0
    if held in known and within(held, 2.0):
        enough = min((b for b in known if b < held and within(b, 0.5)), default=held)
    return max(1, min(max_batch, 2 * enough))


class Probe(NamedTuple):
    """A batch capped lower on purpose: at `rows`, to time a bucket not timed yet, or (`refresh`) to
    re-time one that is."""

    rows: int
    refresh: bool


def refresh_interval(steady: int) -> int:
    """Batches from one re-timing to the next after `steady` re-timings in a row left the cap where
    it was: ``REFRESH_EVERY``, doubling with each, at most ``MAX_REFRESH_EVERY``."""
    return min(MAX_REFRESH_EVERY, REFRESH_EVERY << min(steady, MAX_REFRESH_EVERY.bit_length()))


def probe_limit(rows: int, timed: Container[int], batch_no: int, refresh_turn: int | None) -> Probe | None:
    """The probe of pool batch number `batch_no`, about to take `rows` (its share of the queue, within
    the learned cap), or None. The buckets probed are the two below the batch's own: the next
    smaller, and the one below that, which must be timed to know it is no better. One not in `timed`
    (the buckets with ``MIN_SAMPLES`` batches) is probed every other batch; once both are, a batch
    re-times one of them only when a re-timing is due, `refresh_turn` being then the number of
    re-timings so far (they take turns), None when none is due."""
    top = bucket(rows) if rows >= 1 else 0
    below = [b for b in (top // 4, top // 2) if b >= 1]
    if not below:
        return None
    untimed = [b for b in below if b not in timed]
    if untimed:
        return Probe(untimed[0], refresh=False) if batch_no % 2 else None
    if refresh_turn is None:
        return None
    return Probe(below[refresh_turn % len(below)], refresh=True)


class BatchCap:
    """The pool's batch timings (each bucket's median time per row over its last ``WINDOW`` batches,
    once it has ``MIN_SAMPLES``, with that median's standard error) and the cap they give, 2 at
    first. :meth:`probe` and :meth:`observe` are called under the batcher's lock. With ``learn``
    off, or a max batch of 0 (no batching), the limit is the max batch and nothing is probed."""

    def __init__(self, max_batch: int, learn: bool = True) -> None:
        self.max_batch = max_batch
        self.learn = learn and max_batch > 1
        self.limit = learned_cap({}, max_batch) if self.learn else max_batch
        self._recent: dict[int, collections.deque[float]] = {}
        self._per_row: dict[int, float] = {}  # the median of each bucket with MIN_SAMPLES batches
        self._error: dict[int, float] = {}  # ... and its standard error
        self._batches = 0
        self._refreshes = 0  # re-timings so far
        self._steady = 0  # ... of which this many in a row left the limit where it was
        self._next_refresh = REFRESH_EVERY  # the batch number from which the next one is due

    def probe(self, rows: int) -> int:
        """The rows the pool's next batch may take, `rows` being its share of the queue within the
        learned limit: `rows`, or fewer when it is a probe."""
        if not self.learn:
            return rows
        self._batches += 1
        turn = self._refreshes if self._batches >= self._next_refresh else None
        probe = probe_limit(rows, self._per_row.keys(), self._batches, turn)  # timed: in _per_row
        if probe is None:
            return rows
        if probe.refresh:
            self._refreshes += 1
            self._next_refresh = self._batches + refresh_interval(self._steady)
            self._steady += 1
        return min(probe.rows, rows)

    def observe(self, rows: int, seconds: float) -> bool:
        """Count one pool batch of `rows` that computed in `seconds`; whether the limit changed."""
        if not self.learn or rows < 1:
            return False
        b = bucket(rows)
        recent = self._recent.get(b)
        if recent is None:
            recent = self._recent[b] = collections.deque(maxlen=WINDOW)
        recent.append(seconds / rows)
        if len(recent) < MIN_SAMPLES:
            return False
        self._per_row[b], self._error[b] = median_and_error(recent)
        limit = learned_cap(self._per_row, self.max_batch, self.limit, error=self._error)
        changed, self.limit = limit != self.limit, limit
        if changed:  # the timings moved: re-time the buckets below soon again
            self._steady = 0
            self._next_refresh = min(self._next_refresh, self._batches + REFRESH_EVERY)
        return changed

    def per_row_ms(self) -> dict[int, float]:
        """Each timed bucket's time per row, in ms (for the log line that reports a change)."""
        return {b: round(t * 1e3, 3) for b, t in sorted(self._per_row.items())}
