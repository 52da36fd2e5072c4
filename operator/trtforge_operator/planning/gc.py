"""Engine garbage collection: which stored engines no resource references any more. No I/O.

Engines are a cache shared by every namespace, so nothing is removed when a TRTEngine goes; GC is an
opt-in policy (``gc.enabled``) that deletes engines no TRTEngine status, runtime Deployment or running
build Job references, once they are older than ``gc.minAgeSeconds``, keeping the ``gc.keepLatest``
newest unreferenced ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trtforge_operator.config import GCSettings


@dataclass(frozen=True)
class StoredEngine:
    key: str
    created_at: float  # the manifest's created_at


def plan_gc(
    stored: Iterable[StoredEngine], referenced: Iterable[str], now: float, policy: GCSettings
) -> list[str]:
    """Keys to delete, oldest first."""
    refs = set(referenced)
    candidates = sorted((e for e in stored if e.key not in refs), key=lambda e: e.created_at, reverse=True)
    keep = candidates[: policy.keep_latest]
    kept = {e.key for e in keep}
    out = [e for e in candidates if e.key not in kept and now - e.created_at >= policy.min_age_seconds]
    return [e.key for e in sorted(out, key=lambda e: e.created_at)]


def referenced_keys(
    engine_statuses: Iterable[Mapping[str, object]], template_keys: Iterable[str], job_keys: Iterable[str]
) -> set[str]:
    """Every key some TRTEngine status, runtime pod template or unfinished build Job still uses."""
    out = {str(k) for k in template_keys if k} | {str(k) for k in job_keys if k}
    for st in engine_statuses:
        for t in st.get("targets") or []:  # type: ignore[attr-defined]
            k = t.get("engineKey") if isinstance(t, Mapping) else None
            if k:
                out.add(str(k))
    return out
