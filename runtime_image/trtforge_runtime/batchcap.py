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

from collections.abc import Mapping

TOLERANCE = 0.05  # per-row times within 5% of the best are as good as the best
MIN_SAMPLES = 8  # batches a bucket needs before its time counts
ALPHA = 0.125  # weight of the newest batch in a bucket's moving average


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
    """The pool's batch timings and the cap they give. ``limit`` is read and :meth:`observe` called
    under the batcher's lock. With ``learn`` off, or a max batch of 0 (no batching), the limit stays
    the max batch."""

    def __init__(self, max_batch: int, learn: bool = True) -> None:
        self.max_batch = max_batch
        self.learn = learn and max_batch > 1
        self.limit = max_batch
        self._per_row: dict[int, float] = {}
        self._samples: dict[int, int] = {}

    def observe(self, rows: int, seconds: float) -> bool:
        """Count one pool batch of `rows` that computed in `seconds`; whether the limit changed."""
        if not self.learn or rows < 1:
            return False
        b = bucket(rows)
        per_row = seconds / rows
        n = self._samples.get(b, 0) + 1
        self._samples[b] = n
        old = self._per_row.get(b)
        self._per_row[b] = per_row if old is None else old + ALPHA * (per_row - old)
        timed = {k: t for k, t in self._per_row.items() if self._samples[k] >= MIN_SAMPLES}
        limit = learned_cap(timed, self.max_batch, self.limit)
        changed, self.limit = limit != self.limit, limit
        return changed

    def per_row_ms(self) -> dict[int, float]:
        """Each timed bucket's moving average, in ms per row (for the log line that reports a change)."""
        timed = sorted((b, t) for b, t in self._per_row.items() if self._samples[b] >= MIN_SAMPLES)
        return {b: round(t * 1e3, 3) for b, t in timed}
