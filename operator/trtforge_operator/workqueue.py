"""Which reconcile loop to wake, and whether the loops are alive. No Kubernetes calls.

- :class:`WorkQueue`: one wake-up flag per (kind, namespace, name), plus the two owner indices that
  let an event wake only the loops it concerns: runtime children by their label (the owner's DNS
  name) and InferenceDeployments by the TRTEngine they reference. Every lookup is by key; nothing
  here scans all loops (docs/design.md §"Scale").
- :class:`LoopWatch`: when each reconcile started and each loop last came round, so liveness can
  fail when a loop is wedged instead of answering the time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from trtforge_operator.apply.children import dns_name
from trtforge_operator.kinds import Kind
from trtforge_operator.labels import ANNOTATION_CREATED_FOR, ANNOTATION_RESULT
from trtforge_operator.observe.views import JobView, NodeView

Key = tuple[Kind, str, str]


def job_projection(job: JobView) -> tuple[object, ...]:
    """What a Job's requesters plan from: whether it runs, is done, complete or being deleted, whether
    it has a pod yet (BuildStarting -> BuildRunning), and its result."""
    return (
        job.running,
        job.done,
        job.complete,
        job.deleting,
        job.active > 0,
        job.annotations.get(ANNOTATION_RESULT),
    )


def engine_projection(body: Mapping[str, Any]) -> tuple[object, ...]:
    """What a TRTEngine pass plans from in the object itself: the generation (the spec), its
    annotations (rebuild requests), whether it is being deleted, and its status. Not the finalizers,
    resourceVersion or managedFields, which change with no news for the planner."""
    meta = body.get("metadata") or {}
    return (
        meta.get("generation"),
        bool(meta.get("deletionTimestamp")),
        tuple(sorted((meta.get("annotations") or {}).items())),
        body.get("status") or {},
    )


def own_create_echo(created_here: bool, job: JobView) -> bool:
    """Whether a Job's event is only the Job one of our passes just created coming back on the watch:
    `created_here` (created by this process and not seen in an event since), and still as created:
    running, no pod, no result. The pass that POSTed it planned from exactly that, so waking its
    engine again only repeats the plan (one more pass per engine per wave: docs/design.md §"Scale")."""
    return (
        created_here
        and job.running
        and not job.deleting
        and job.active == 0
        and ANNOTATION_RESULT not in job.annotations
    )


def verify_job_engine(job: JobView) -> str | None:
    """The TRTEngine a verify Job's event wakes: the one its `created-for` annotation names, and only
    in the Job's own namespace. A tenant can put any annotation on a Job of its own, so a name in
    another namespace wakes nothing (docs/security.md)."""
    ns, sep, name = job.annotations.get(ANNOTATION_CREATED_FOR, "").partition("/")
    return name if sep and name and ns == job.namespace else None


class WorkQueue:
    """Wake-up flags of the reconcile loops and the indices that find them by what an event names."""

    def __init__(self) -> None:
        self._events: dict[Key, asyncio.Event] = {}
        self._by_label: dict[tuple[Kind, str, str], set[str]] = {}
        self._engine_of: dict[tuple[str, str], str] = {}  # (ns, InferenceDeployment) -> TRTEngine
        self._users: dict[tuple[str, str], set[str]] = {}  # (ns, TRTEngine) -> InferenceDeployments
        self._nodes: dict[str, NodeView] = {}
        self._jobs: dict[str, tuple[object, ...]] = {}
        self._waiting: set[tuple[str, str]] = set()  # TRTEngines a build slot refused, by (ns, name)
        self._engines: dict[tuple[str, str], tuple[object, ...]] = {}  # (ns, name) -> engine_projection
        self._infd_faults: dict[tuple[str, str], str] = {}  # (ns, name) -> its status.faults, as JSON

    def get(self, kind: Kind, namespace: str, name: str) -> asyncio.Event:
        key = (kind, namespace, name)
        if key not in self._events:
            self._events[key] = asyncio.Event()
            self._by_label.setdefault((kind, namespace, dns_name(name)), set()).add(name)
        return self._events[key]

    def drop(self, kind: Kind, namespace: str, name: str) -> None:
        self._events.pop((kind, namespace, name), None)
        names = self._by_label.get((kind, namespace, dns_name(name)))
        if names is not None:
            names.discard(name)
            if not names:
                del self._by_label[(kind, namespace, dns_name(name))]
        if kind == Kind.INFERENCEDEPLOYMENT:
            self.set_engine_ref(namespace, name, None)
            self._infd_faults.pop((namespace, name), None)
        else:
            self._waiting.discard((namespace, name))
            self._engines.pop((namespace, name), None)

    def engine_changed(self, namespace: str, name: str, projection: tuple[object, ...] | None) -> bool:
        """True when a TRTEngine is new, gone, or changed in what its pass plans from. Kopf's own
        finalizer patch of each new engine changes none of it: waking the loop for it cost every new
        engine a second pass that could only repeat the first."""
        key = (namespace, name)
        if projection is None:
            return self._engines.pop(key, None) is not None
        old = self._engines.get(key)
        self._engines[key] = projection
        return old != projection

    def infd_faults_changed(self, namespace: str, name: str, faults: str | None) -> bool:
        """True when an InferenceDeployment's recorded faults (`faults`, None once it is gone) differ
        from the last seen, and there are or were some: its TRTEngine plans rebuilds from them."""
        key = (namespace, name)
        old = self._infd_faults.pop(key, None) if faults is None else self._infd_faults.get(key)
        if faults is not None:
            self._infd_faults[key] = faults
        return old != faults and (old not in (None, "null") or faults not in (None, "null"))

    def set_waiting_for_slot(self, namespace: str, engine: str, waiting: bool) -> None:
        """Record whether a TRTEngine's last pass was refused a build slot."""
        if waiting:
            self._waiting.add((namespace, engine))
        else:
            self._waiting.discard((namespace, engine))

    def fire_waiting_for_slot(self) -> None:
        """A build slot freed: wake every TRTEngine that was refused one (they plan again and admission
        decides which get it), instead of leaving them to the next resync."""
        for ns, name in list(self._waiting):
            self.fire(Kind.TRTENGINE, ns, name)

    def fire(self, kind: Kind, namespace: str, name: str) -> None:
        ev = self._events.get((kind, namespace, name))
        if ev is not None:
            ev.set()

    def fire_every(self, kind: Kind) -> None:
        """Wake every loop of `kind` (only for what concerns all of them: a Node's GPUs changed)."""
        for (k, _, _), ev in list(self._events.items()):
            if k == kind:
                ev.set()

    def fire_label(self, kind: Kind, namespace: str, label: str) -> None:
        """Wake the loops of `kind` in `namespace` whose children carry `label` (dns_name of the name)."""
        for name in list(self._by_label.get((kind, namespace, label), ())):
            self.fire(kind, namespace, name)

    def set_engine_ref(self, namespace: str, deployment: str, engine: str | None) -> None:
        """Record which TRTEngine an InferenceDeployment serves (None: forget it)."""
        old = self._engine_of.pop((namespace, deployment), None)
        if old is not None:
            users = self._users.get((namespace, old))
            if users is not None:
                users.discard(deployment)
                if not users:
                    del self._users[(namespace, old)]
        if engine is not None:
            self._engine_of[(namespace, deployment)] = engine
            self._users.setdefault((namespace, engine), set()).add(deployment)

    def deployments_of(self, namespace: str, engine: str) -> list[str]:
        return sorted(self._users.get((namespace, engine), ()))

    def fire_deployments_of(self, namespace: str, engine: str) -> None:
        """Wake the InferenceDeployments that serve this TRTEngine, and no other."""
        for name in self.deployments_of(namespace, engine):
            self.fire(Kind.INFERENCEDEPLOYMENT, namespace, name)

    def job_changed(self, name: str, projection: tuple[object, ...] | None) -> bool:
        """True when a Job is new, gone, or its state (running, done, result) changed: what its
        requesters plan from. A requester annotation added by one engine wakes no other engine (with
        N engines sharing a Job, waking all on each claim made the work N squared)."""
        if projection is None:
            return self._jobs.pop(name, None) is not None
        old = self._jobs.get(name)
        self._jobs[name] = projection
        return old != projection

    def node_changed(self, view: NodeView | None, name: str) -> bool:
        """True when a Node's projection (labels, GPU resources, health) changed, not just a heartbeat."""
        if view is None:
            return self._nodes.pop(name, None) is not None
        old = self._nodes.get(name)
        self._nodes[name] = view
        return old != view


def jittered(period: float, u: float) -> float:
    """`period` spread by +-10% (`u` uniform in [0, 1)), so loops that started together (a restart, a
    burst of creates) do not resync together forever after."""
    return period * (0.9 + 0.2 * u)


class LoopWatch:
    """Start times of running reconciles and when each idle loop is due to come round again.

    Wedged when one reconcile has run longer than `stuck_after` seconds (an API call that never
    returns, a deadlock), or when an idle loop is more than `stuck_after` past the time it was due
    (its resync or requeue): then nothing is running the loops. Judged per loop, so a long resync
    period (TRTEngines: 5 min) of a quiet cluster is not mistaken for a wedge.
    """

    def __init__(self, stuck_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stuck_after = stuck_after
        self._clock = clock
        self._running: dict[Key, float] = {}
        self._due: dict[Key, float] = {}

    def started(self, key: Key) -> None:
        self._running[key] = self._clock()
        self._due.pop(key, None)

    def finished(self, key: Key, due_in: float) -> None:
        """The pass of `key` ended; its loop comes round again within `due_in` seconds."""
        self._running.pop(key, None)
        self._due[key] = self._clock() + due_in

    def forget(self, key: Key) -> None:
        self._running.pop(key, None)
        self._due.pop(key, None)

    def problem(self) -> str | None:
        """Why liveness should fail now, or None when every loop is making progress."""
        now = self._clock()
        for key, t0 in list(self._running.items()):
            if now - t0 > self.stuck_after:
                kind, ns, name = key
                return f"{kind} {ns}/{name}: one reconcile has run for {now - t0:.0f}s"
        if self._due:
            (kind, ns, name), due = min(self._due.items(), key=lambda kv: kv[1])
            if now - due > self.stuck_after:
                return f"{kind} {ns}/{name}: its loop was due {now - due:.0f}s ago and has not come round"
        return None
