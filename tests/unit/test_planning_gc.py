"""Engine GC: only unreferenced, old enough engines go; the newest unreferenced ones may be kept."""

from __future__ import annotations

from trtforge_operator.config import GCSettings
from trtforge_operator.planning.gc import StoredEngine, plan_gc, referenced_keys, unrecorded_requests

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


def test_a_target_without_an_engine_key_protects_what_its_request_key_resolves_to() -> None:
    """A build published its engine but the TRTEngine has not recorded it yet: the request index
    names the engine, so GC keeps it; a target that records an engine key is not resolved again."""
    filed = {"r1": "a", "r2": "b"}
    statuses = [
        {"targets": [{"requestKey": "r1"}, {"requestKey": "r2", "engineKey": "c"}, {"requestKey": "r3"}]}
    ]
    assert unrecorded_requests(statuses) == {"r1", "r3"}
    refs = referenced_keys(statuses, template_keys=[], job_keys=[], filed=filed)
    assert refs == {"a", "c"}
    stored = [StoredEngine(k, NOW - 10_000) for k in "abc"]
    assert plan_gc(stored, refs, NOW, GCSettings(min_age_seconds=0)) == ["b"]


def test_engines_newer_than_an_unresolved_running_build_are_kept() -> None:
    """Between a builder's manifest and its request-index entry, only the Job's start time links the
    build to its engine: nothing created since (less the clock-skew margin) is collected."""
    started = NOW - 1_000
    old, new, skewed = (
        StoredEngine("old", started - 10_000),
        StoredEngine("new", started + 5),
        StoredEngine("skewed", started - 30),
    )
    policy = GCSettings(min_age_seconds=0)
    assert plan_gc([old, new, skewed], set(), NOW, policy, unresolved_build_started=started) == ["old"]
    assert plan_gc([old, new, skewed], set(), NOW, policy) == ["old", "skewed", "new"]
