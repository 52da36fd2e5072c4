"""What a TRTEngine pass observes, as one typed view for the pure planners."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from trtforge.contract.build_result import BuildFailure
from trtforge.contract.engine_key import (
    RequestRecord,
)
from trtforge.contract.manifest import Manifest
from trtforge.contract.possession import PossessionRecord, source_fingerprint
from trtforge_operator.api import (
    TRTEngineSpec,
    TRTEngineStatus,
)
from trtforge_operator.observed import JobView, NodeView
from trtforge_operator.planning.rebuild import ObservedFaults

ManifestLookup = Callable[[str], Manifest | None]
RequestLookup = Callable[[str], RequestRecord | None]


def no_requests(_request_key: str) -> RequestRecord | None:
    return None


@dataclass(frozen=True)
class Capacity:
    """Build Jobs running now, cluster-wide and requested from this namespace, and the limits."""

    running_total: int
    running_in_namespace: int
    max_total: int
    max_per_namespace: int

    def allows(self, extra_total: int, extra_ns: int) -> bool:
        return (
            self.running_total + extra_total < self.max_total
            and self.running_in_namespace + extra_ns < self.max_per_namespace
        )


@dataclass(frozen=True)
class EngineObserved:
    namespace: str
    name: str
    generation: int
    spec: TRTEngineSpec
    status: TRTEngineStatus
    nodes: Sequence[NodeView]
    # Build Jobs of the build namespace: a list, or (the operator's way) an index by build id, so one
    # pass looks up only its own targets' Jobs instead of scanning every Job (docs/design.md §"Scale").
    jobs: Sequence[JobView] | Mapping[str, Iterable[object]]
    manifests: ManifestLookup
    capacity: Capacity
    now: float
    unschedulable: Mapping[str, str] = field(default_factory=dict)  # build Job -> why its pod waits
    requests: RequestLookup = no_requests  # the store's request index: request key -> engine
    uid: str = ""
    # Proof of possession (docs/security.md): the broker's record for this namespace and the current
    # source (None: not proven yet), the verify Jobs of this namespace, and why finished ones failed.
    possession: PossessionRecord | None = None
    verify_jobs: Sequence[JobView] = ()
    verify_failures: Mapping[str, BuildFailure] = field(default_factory=dict)  # failed verify Job -> why
    # Running verify Job -> why its pod cannot start (the kubelet's or scheduler's reason and message).
    verify_stuck: Mapping[str, str] = field(default_factory=dict)
    cache_scope: str = ""  # the namespace's cache scope (CacheSettings.scope)

    @cached_property  # hashed once per pass, not once per target and call
    def source_fingerprint(self) -> str:
        m = self.spec.model
        return source_fingerprint(m.uri, m.secret_ref.name if m.secret_ref else None, m.sha256)

    @cached_property
    def verified_sha256(self) -> str | None:
        """The model digest this namespace proved it holds through the current source, else None."""
        p = self.possession
        if p is None or not p.proves(self.namespace, self.source_fingerprint, self.spec.model.sha256 or None):
            return None
        return p.sha256

    # Rebuilds (planning/rebuild.py): the faults this namespace's InferenceDeployments that serve this
    # engine recorded in their status, and the engine's own annotations (where a tenant may ask for a
    # rebuild of one of its targets). This planner creates the Jobs, the one owner of build Jobs.
    observed_faults: Sequence[ObservedFaults] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


class _IndexedJobs(Mapping[str, list[JobView]]):
    """Live Jobs of an index keyed by build id, looked up one id at a time (never scanned whole)."""

    def __init__(self, index: Mapping[str, Iterable[object]]) -> None:
        self._index = index

    def __getitem__(self, build_id: str) -> list[JobView]:
        found = [j for j in list(self._index.get(build_id, ())) if isinstance(j, JobView) and not j.deleting]
        if not found:
            raise KeyError(build_id)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._index))

    def __len__(self) -> int:
        return len(self._index)


def jobs_by_build_id(jobs: Sequence[JobView] | Mapping[str, Iterable[object]]) -> Mapping[str, list[JobView]]:
    """The live (not deleting) Jobs per build id, from a list or from an index keyed by build id."""
    if isinstance(jobs, Mapping):
        return _IndexedJobs(jobs)
    out: dict[str, list[JobView]] = {}
    for j in jobs:
        if not j.deleting:
            out.setdefault(j.build_id, []).append(j)
    return out


def obs_requester(obs: EngineObserved) -> str:
    return f"{obs.namespace}/{obs.name}"
