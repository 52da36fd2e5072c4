"""Build capacity, counted as Job events arrive and admitted in one synchronous step.

The counts are kept up to date by the Job event handler (one Job at a time), so asking for the
capacity costs nothing per reconcile, and :meth:`BuildSlots.admit` checks and reserves in one step
with no ``await`` in it: two reconciles can never both take the last slot, and no lock is held
across an API call (docs/design.md §"Scale").

Only the operator's own build Jobs hold a slot: Jobs in the build namespace, where no tenant can
create or edit anything. A Job anywhere else is never counted, whatever its labels say, and the
namespace a slot is counted against is the one the operator reserved it for, or, for a Job it did not
reserve in this process (a restart, another replica), the requester the operator wrote on the Job
when it created it. Nothing a tenant can write names a slot's namespace (docs/security.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

from trtforge_operator.observe.views import Capacity, JobView

JobRef = tuple[str, str]  # (namespace, name): a Job's name is unique only within its namespace

# A Job created but not seen in an event yet is counted for at most this long.
PENDING_TTL_S = 60.0


class BuildSlots:
    def __init__(
        self,
        max_total: int,
        max_per_namespace: int,
        build_namespace: str,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_total = max_total
        self.max_per_namespace = max_per_namespace
        self.build_namespace = build_namespace
        self._clock = clock
        self._running: dict[JobRef, str] = {}  # Job -> requesting namespace
        self._pending: dict[JobRef, tuple[float, str]] = {}  # Job -> (reserved at, namespace)
        self._by_ns: Counter[str] = Counter()  # running + pending per namespace

    def _ref(self, name: str) -> JobRef:
        return (self.build_namespace, name)

    def observe(self, job: JobView) -> None:
        """A Job event: count it while it runs, forget it when it is done or deleted. A Job outside
        the build namespace is none of ours and changes nothing."""
        ref = (job.namespace, job.name)
        if job.namespace != self.build_namespace:
            return
        reserved = self._pending.get(ref)
        self._unpend(ref)
        if job.running and not job.deleting:
            namespace = slot_namespace(job, reserved[1] if reserved is not None else None)
            if ref not in self._running:
                self._running[ref] = namespace
                self._by_ns[namespace] += 1
        else:
            self._forget(ref)

    def forget(self, name: str) -> None:
        """The build Job `name` is gone (deleted, or its create failed)."""
        self._forget(self._ref(name))

    def _forget(self, ref: JobRef) -> None:
        self._unpend(ref)
        ns = self._running.pop(ref, None)
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
        return self._ref(name) in self._pending or self._ref(name) in self._running

    def awaiting_event(self, name: str) -> bool:
        """Whether the build Job `name` was created by this operator and no event has shown it since."""
        self._expire()
        return self._ref(name) in self._pending

    @property
    def held(self) -> int:
        """Slots held now: running Jobs and reservations not seen yet (fewer than before: one freed)."""
        return len(self._running) + len(self._pending)

    @property
    def running(self) -> int:
        return len(self._running)

    def admit(self, names: Sequence[str], namespace: str) -> bool:
        """Reserve a slot for each of these build Jobs (names in the build namespace) for `namespace`,
        the requester's, if all fit now; False (nothing reserved) otherwise."""
        refs = [self._ref(n) for n in names]
        new = [r for r in refs if r not in self._pending and r not in self._running]
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

    def _unpend(self, ref: JobRef) -> None:
        hit = self._pending.pop(ref, None)
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
            ref, (t, _) = next(iter(self._pending.items()))
            if now - t <= PENDING_TTL_S:
                break
            self._unpend(ref)


def slot_namespace(job: JobView, reserved_for: str | None) -> str:
    """The namespace a running build Job's slot counts against: the one this process reserved it for,
    else the requester the operator wrote on the Job when it created it (the build namespace is the
    operator's alone). A Job with neither counts against the build namespace itself: it still holds
    a slot of the total, and no tenant's."""
    if reserved_for is not None:
        return reserved_for
    ns, sep, _ = job.created_for.partition("/")
    return ns if sep and ns else job.namespace
