"""The batch cap a pool learns from its own batch timings (docs/design.md, "Learning the batch cap").

A bigger batch is worth its latency only while it computes each row faster: every request of a batch
waits for the batch's last row. The pool times its batches by size bucket (powers of two) and caps
its batches at twice the smallest bucket whose time per row is within ``TOLERANCE`` of the best
bucket's, so the bucket above keeps being timed: when it gets faster (a GPU engine, a quieter
machine), the cap climbs again. Until two buckets are timed, the cap is the max batch size. The
choice in force holds while its bucket stays within twice the tolerance and no smaller bucket comes
within half of it, so timings near the edge do not flip the cap back and forth.

:func:`learned_cap` decides; :class:`BatchCap` keeps the timings and applies it.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Mapping

TOLERANCE = 0.05  # per-row times within 5% of the best are as good as the best
MIN_SAMPLES = 8  # batches a bucket needs before its time counts
WINDOW = 16  # a bucket's time is the median of its last WINDOW batches (one slow batch moves nothing)


def bucket(rows: int) -> int:
    """The power of two at or below `rows` (rows >= 1)."""
    return 1 << (rows.bit_length() - 1)


def learned_cap(
    per_row: Mapping[int, float], max_batch: int, current: int | None = None, tolerance: float = TOLERANCE
) -> int:
    """The batch cap for `per_row` (seconds per row by bucket, timed buckets only): `max_batch` while
    fewer than two buckets are timed; else twice the smallest bucket within `tolerance` of the best
    per-row time, at most `max_batch` (and at least 1).

    With the `current` cap's bucket (half of it) timed and within twice the tolerance, it stays,
    unless smaller buckets come within half the tolerance (then the smallest of those)."""
    known = {b: t for b, t in per_row.items() if b <= max_batch}
    if max_batch < 1 or len(known) < 2:
        return max_batch
    best = min(known.values())
    enough = min(b for b, t in known.items() if t <= (1 + tolerance) * best)
    held = current // 2 if current else 0
    if held in known and known[held] <= (1 + 2 * tolerance) * best:
        clearly = [b for b, t in known.items() if b < held and t <= (1 + tolerance / 2) * best]
        enough = min(clearly, default=held)
    return max(1, min(max_batch, 2 * enough))


class BatchCap:
    """The pool's batch timings (the median time per row of each bucket's last ``WINDOW`` batches,
    once it has ``MIN_SAMPLES``) and the cap they give. ``limit`` is read and :meth:`observe` called
    under the batcher's lock. With ``learn`` off, or a max batch of 0 (no batching), the limit stays
    the max batch."""

    def __init__(self, max_batch: int, learn: bool = True) -> None:
        self.max_batch = max_batch
        self.learn = learn and max_batch > 1
        self.limit = max_batch
        self._recent: dict[int, collections.deque[float]] = {}
        self._per_row: dict[int, float] = {}  # the median of each bucket with MIN_SAMPLES batches

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
        self._per_row[b] = statistics.median(recent)
        limit = learned_cap(self._per_row, self.max_batch, self.limit)
        changed, self.limit = limit != self.limit, limit
        return changed

    def per_row_ms(self) -> dict[int, float]:
        """Each timed bucket's time per row, in ms (for the log line that reports a change)."""
        return {b: round(t * 1e3, 3) for b, t in sorted(self._per_row.items())}
