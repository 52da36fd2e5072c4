"""GC of the verify side of the store (issue 52): staged models (``models/``), possession records and
verify grants nothing references any more are collected under the engines' GC policy. Pure."""

from __future__ import annotations

import pytest
from trtforge_operator.config import GCSettings
from trtforge_operator.planning.gc import StoredGrant, StoredProof, plan_model_gc

NOW = 10_000_000.0
DAY = 86400.0
POLICY = GCSettings(enabled=True, min_age_seconds=DAY)
M1, M2, M3 = "1" * 64, "2" * 64, "3" * 64
FA, FB = "a" * 64, "b" * 64


def proof(ns: str, fp: str, sha: str, age: float) -> StoredProof:
    return StoredProof(ns, fp, sha, NOW - age)


@pytest.mark.parametrize(
    ("name", "models", "proofs", "grants", "current", "builds", "gone_proofs", "gone_models", "gone_grants"),
    [
        (
            "a current source keeps its record and model",
            [M1],
            [proof("a", FA, M1, 2 * DAY)],
            [],
            [("a", FA)],
            [],
            [],
            [],
            [],
        ),
        (
            "no TRTEngine names the source: record and model go",
            [M1],
            [proof("a", FA, M1, 2 * DAY)],
            [],
            [],
            [],
            [("a", FA)],
            [M1],
            [],
        ),
        (
            "too young to collect",
            [M1],
            [proof("a", FA, M1, DAY / 2)],
            [],
            [],
            [],
            [],
            [],
            [],
        ),
        (
            "another namespace's record keeps the model",
            [M1],
            [proof("a", FA, M1, 2 * DAY), proof("b", FB, M1, 2 * DAY)],
            [],
            [("b", FB)],
            [],
            [("a", FA)],
            [],
            [],
        ),
        (
            "the same source in another namespace is another record",
            [M1],
            [proof("a", FA, M1, 2 * DAY)],
            [],
            [("b", FA)],
            [],
            [("a", FA)],
            [M1],
            [],
        ),
        ("a model no record names goes (an upload nobody recorded)", [M2], [], [], [], [], [], [M2], []),
        ("a running build reads it: it stays", [M2], [], [], [], [M2], [], [], []),
        (
            "a pending verification keeps every model this pass, and the grant",
            [M1, M2],
            [proof("a", FA, M1, 2 * DAY)],
            [StoredGrant("c", "trtforge-verify-x", NOW + 60)],
            [],
            [],
            [("a", FA)],
            [],
            [],
        ),
        (
            "an expired grant goes and keeps nothing",
            [M3],
            [],
            [StoredGrant("c", "trtforge-verify-x", NOW - 1)],
            [],
            [],
            [],
            [M3],
            [("c", "trtforge-verify-x")],
        ),
    ],
)
def test_model_gc(
    name: str,
    models: list[str],
    proofs: list[StoredProof],
    grants: list[StoredGrant],
    current: list[tuple[str, str]],
    builds: list[str],
    gone_proofs: list[tuple[str, str]],
    gone_models: list[str],
    gone_grants: list[tuple[str, str]],
) -> None:
    plan = plan_model_gc(models, proofs, grants, current, builds, NOW, POLICY)
    assert (plan.proofs, plan.models, plan.grants) == (gone_proofs, gone_models, gone_grants), name


def test_a_record_written_after_the_trtengines_were_listed_stays() -> None:
    rec = proof("a", FA, M1, 2 * DAY)
    plan = plan_model_gc([M1], [rec], [], [], [], NOW, POLICY, sources_listed_at=rec.verified_at)
    assert (plan.proofs, plan.models) == ([], [])
    later = plan_model_gc([M1], [rec], [], [], [], NOW, POLICY, sources_listed_at=NOW)
    assert (later.proofs, later.models) == ([("a", FA)], [M1])
    # within the clock-skew allowance of the listing: it stays; past it: it goes
    listed = rec.verified_at + 30
    assert plan_model_gc([M1], [rec], [], [], [], NOW, POLICY, sources_listed_at=listed).proofs == []
    tight = POLICY.model_copy(update={"clock_skew_seconds": 5})
    gone = plan_model_gc([M1], [rec], [], [], [], NOW, tight, sources_listed_at=listed)
    assert (gone.proofs, gone.models) == ([("a", FA)], [M1])


def test_a_record_of_a_namespace_the_operator_does_not_watch_stays() -> None:
    """With watchNamespaces set the TRTEngines are listed only there: another namespace's record
    (another release's, or one no longer watched) is not known to be unreferenced."""
    theirs, ours = proof("other", FA, M1, 2 * DAY), proof("a", FA, M2, 2 * DAY)
    plan = plan_model_gc([M1, M2], [theirs, ours], [], [], [], NOW, POLICY, namespaces=frozenset({"a"}))
    assert (plan.proofs, plan.models) == ([("a", FA)], [M2])
    everywhere = plan_model_gc([M1, M2], [theirs, ours], [], [], [], NOW, POLICY)
    assert (everywhere.proofs, everywhere.models) == ([("a", FA), ("other", FA)], [M1, M2])
