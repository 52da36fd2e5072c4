"""Build capacity, counted as Job events arrive and admitted in one synchronous step.

The counts are kept up to date by the Job event handler (one Job at a time), so asking for the
capacity costs nothing per reconcile, and :meth:`BuildSlots.admit` checks and reserves in one step
with no ``await`` in it: two reconciles can never both take the last slot, and no lock is held
across an API call (docs/design.md §"Scale").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

from trtforge_operator.observed import JobView
from trtforge_operator.planning.observed_engine import Capacity

# A Job created but not seen in an event yet is counted for at most this long.
PENDING_TTL_S = 60.0


class BuildSlots:
    def __init__(self, max_total: int, max_per_namespace: int, clock: Callable[[], float] = time.monotonic):
        self.max_total = max_total
        self.max_per_namespace = max_per_namespace
        self._clock = clock
        self._running: dict[str, str] = {}  # Job name -> requesting namespace
        self._pending: dict[str, tuple[float, str]] = {}  # Job name -> (reserved at, namespace)
        self._by_ns: Counter[str] = Counter()  # running + pending per namespace

    def observe(self, job: JobView, namespace: str) -> None:
        """A Job event: count it while it runs, forget it when it is done or deleted."""
        self._unpend(job.name)
        if job.running and not job.deleting:
            if job.name not in self._running:
                self._running[job.name] = namespace
                self._by_ns[namespace] += 1
        else:
            self.forget(job.name)

    def forget(self, name: str) -> None:
        self._unpend(name)
        ns = self._running.pop(name, None)
        if ns is not None:
            self._dec(ns)

    def capacity(self, namespace: str) -> Capacity:
        self._expire()
        return Capacity(
            len(self._running) + len(self._pending),
            self._by_ns[namespace],
            self.max_total,
            self.max_per_namespace,
        )

    def known(self, name: str) -> bool:
        """Whether the Job `name` runs, or was created by this operator and not seen in an event yet
        (a pass that plans it again before the event arrives need not POST it again)."""
        self._expire()
        return name in self._pending or name in self._running

    def awaiting_event(self, name: str) -> bool:
        """Whether the Job `name` was created by this operator and no event has shown it since."""
        self._expire()
        return name in self._pending

    @property
    def held(self) -> int:
        """Slots held now: running Jobs and reservations not seen yet (fewer than before: one freed)."""
        return len(self._running) + len(self._pending)

    @property
    def running(self) -> int:
        return len(self._running)

    def admit(self, names: Sequence[str], namespace: str) -> bool:
        """Reserve a slot for each of these Jobs if all fit now; False (nothing reserved) otherwise."""
        new = [n for n in names if n not in self._pending and n not in self._running]
        if not new:
            return True
        cap = self.capacity(namespace)
        if cap.running_total + len(new) > self.max_total or cap.running_in_namespace + len(new) > (
            self.max_per_namespace
        ):
            return False
        now = self._clock()
        for n in new:
            self._pending[n] = (now, namespace)
            self._by_ns[namespace] += 1
        return True

    def _unpend(self, name: str) -> None:
        hit = self._pending.pop(name, None)
        if hit is not None:
            self._dec(hit[1])

    def _dec(self, namespace: str) -> None:
        self._by_ns[namespace] -= 1
        if self._by_ns[namespace] <= 0:
            del self._by_ns[namespace]

    def _expire(self) -> None:
        # Reservations are inserted in time order and a dict keeps that order, so the expired ones
        # are at the front: stop at the first live one. Scanning all of them on every call made
        # each pass cost O(Jobs in flight), N squared over a wave of N engines (docs/design.md §"Scale").
        now = self._clock()
        while self._pending:
            name, (t, _) = next(iter(self._pending.items()))
            if now - t <= PENDING_TTL_S:
                break
            self._unpend(name)
