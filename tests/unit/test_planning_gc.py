"""Engine GC: only unreferenced, old enough engines go; the newest unreferenced ones may be kept."""

from __future__ import annotations

from trtforge_operator.config import GCSettings
from trtforge_operator.planning.gc import StoredEngine, plan_gc, referenced_keys

NOW = 1_000_000.0


def test_unreferenced_and_old_only() -> None:
    stored = [StoredEngine("a", NOW - 10_000), StoredEngine("b", NOW - 10_000), StoredEngine("c", NOW - 10)]
    refs = referenced_keys([{"targets": [{"engineKey": "a"}]}], template_keys=[], job_keys=[])
    assert plan_gc(stored, refs, NOW, GCSettings(enabled=True, min_age_seconds=3600)) == ["b"]


def test_keep_latest_and_every_kind_of_reference() -> None:
    stored = [StoredEngine(k, NOW - 10_000 - i) for i, k in enumerate("abcde")]
    refs = referenced_keys([{"targets": [{"engineKey": "a"}]}], template_keys=["b"], job_keys=["c"])
    assert refs == {"a", "b", "c"}
    # d is newer than e: keep_latest=1 keeps d.
    assert plan_gc(stored, refs, NOW, GCSettings(min_age_seconds=0, keep_latest=1)) == ["e"]
