"""Engine garbage collection: which stored engines no resource references any more. No I/O.

Engines are a cache shared by every namespace, so nothing is removed when a TRTEngine goes; GC is an
opt-in policy (``gc.enabled``) that deletes engines no TRTEngine status, runtime Deployment or running
build Job references, once they are older than ``gc.minAgeSeconds``, keeping the ``gc.keepLatest``
newest unreferenced ones.

An engine is also referenced through a *request key* (docs/design.md "Engine keys"): a build that has
just published its engine, but whose TRTEngine has not yet recorded the engine key, is named only by
the request key on its Job and in the target's status. The store's request index resolves those.
A builder files that index entry just after the manifest, so while a build runs whose request the
index does not answer yet, every engine created since that build began is kept for this pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from trtforge_operator.config import GCSettings


@dataclass(frozen=True)
class StoredEngine:
    key: str
    created_at: float  # the manifest's created_at


# Clock skew allowed between the apiserver (a Job's start time) and a builder pod (a manifest's time).
CLOCK_SKEW_S = 60.0


def plan_gc(
    stored: Iterable[StoredEngine],
    referenced: Iterable[str],
    now: float,
    policy: GCSettings,
    unresolved_build_started: float | None = None,
) -> list[str]:
    """Keys to delete, oldest first.

    ``unresolved_build_started``: the earliest start of a running build whose engine the request
    index does not name yet; engines created since then may be its output and are not candidates."""
    refs = set(referenced)
    guard = None if unresolved_build_started is None else unresolved_build_started - CLOCK_SKEW_S
    candidates = sorted(
        (e for e in stored if e.key not in refs and (guard is None or e.created_at < guard)),
        key=lambda e: e.created_at,
        reverse=True,
    )
    keep = candidates[: policy.keep_latest]
    kept = {e.key for e in keep}
    out = [e for e in candidates if e.key not in kept and now - e.created_at >= policy.min_age_seconds]
    return [e.key for e in sorted(out, key=lambda e: e.created_at)]


def referenced_keys(
    engine_statuses: Iterable[Mapping[str, object]],
    template_keys: Iterable[str],
    job_keys: Iterable[str],
    resolve_request: Callable[[str], str | None] = lambda _rk: None,
) -> set[str]:
    """Every engine key some TRTEngine status, runtime pod template or build Job still uses.

    ``job_keys``: the engine keys build Jobs name or produced; ``resolve_request`` maps the request key
    of a target with no engine key yet to the engine key the store's request index files for it (None
    when none is filed)."""
    out = {str(k) for k in template_keys if k} | {str(k) for k in job_keys if k}
    requests: set[str] = set()
    for st in engine_statuses:
        for t in st.get("targets") or []:  # type: ignore[attr-defined]
            if not isinstance(t, Mapping):
                continue
            if k := t.get("engineKey"):
                out.add(str(k))
            elif rk := t.get("requestKey"):  # built, perhaps, but not yet recorded
                requests.add(str(rk))
    for rk in sorted(requests):
        if k := resolve_request(rk):
            out.add(k)
    return out
