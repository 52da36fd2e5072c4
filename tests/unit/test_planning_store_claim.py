"""The store's claim: its typed view, and the StoreReady condition a claim that cannot bind gives."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from trtforge_operator.api import TRTEngineStatus, get_condition
from trtforge_operator.observe.claim_view import (
    ClaimPhase,
    StoreBlockedEngine,
    StoreClaimView,
    store_claim_name,
)
from trtforge_operator.planning.engine import plan_engine, plan_engine_pass
from trtforge_operator.planning.engine_actions import Emit, WriteStatus
from trtforge_operator.planning.store_claim import (
    STORE_READY,
    StoreReason,
    claim_message,
    plan_store_blocked,
    store_condition,
)

from tests.unit.test_planning_engine import CFG, H100, engine, observe

NOW = 1_800_000_000.0


def _pvc(phase: str | None, storage_class: Any = "missing-class") -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}
    if storage_class is not ...:
        spec["storageClassName"] = storage_class
    return {"spec": spec, "status": {"phase": phase} if phase else {}}


EVENTS = [
    {"reason": "ExternalProvisioning", "message": "waiting", "lastTimestamp": "2026-01-01T00:00:00Z"},
    {
        "reason": "ProvisioningFailed",
        "message": 'storageclass.storage.k8s.io "missing-class" not found',
        "lastTimestamp": "2026-01-01T00:01:00Z",
    },
]


def pending(storage_class: Any = "missing-class") -> StoreClaimView:
    return StoreClaimView.from_k8s(
        "trtforge-system", "trtforge-engines", _pvc("Pending", storage_class), EVENTS
    )


def test_store_claim_name_only_for_pvc_stores() -> None:
    assert store_claim_name("pvc://trtforge-engines/prefix") == "trtforge-engines"
    assert store_claim_name("pvc://trtforge-engines") == "trtforge-engines"
    assert store_claim_name("s3://bucket/prefix") is None
    assert store_claim_name("/var/lib/trtforge") is None


def test_view_reads_phase_class_modes_and_the_latest_event() -> None:
    v = pending()
    assert v.phase is ClaimPhase.PENDING and not v.bound
    assert v.storage_class == "missing-class"
    assert v.access_modes == ("ReadWriteMany",)
    assert v.event_reason == "ProvisioningFailed"
    assert StoreClaimView.from_k8s("ns", "c", _pvc(None), []).phase is ClaimPhase.PENDING
    assert StoreClaimView.from_k8s("ns", "c", _pvc("Bound"), []).bound
    missing = StoreClaimView.from_k8s("ns", "c", None, [])
    assert missing.phase is ClaimPhase.MISSING and missing.event_reason is None


def test_message_names_claim_class_mode_event_and_what_to_do() -> None:
    msg = claim_message(pending())
    for part in (
        "trtforge-system/trtforge-engines",
        'StorageClass "missing-class"',
        "ReadWriteMany",
        "ProvisioningFailed",
        "s3://",
    ):
        assert part in msg, part
    assert "the cluster's default StorageClass" in claim_message(pending(storage_class=...))
    assert 'storageClassName ""' in claim_message(pending(storage_class=""))


@pytest.mark.parametrize(
    ("pvc", "reason"),
    [
        (_pvc("Pending"), StoreReason.CLAIM_PENDING),
        (_pvc("Lost"), StoreReason.CLAIM_LOST),
        (None, StoreReason.CLAIM_MISSING),
    ],
)
def test_unbound_claim_sets_store_ready_false_with_a_typed_reason(
    pvc: dict[str, Any] | None, reason: StoreReason
) -> None:
    view = StoreClaimView.from_k8s("ns", "c", pvc, [])
    c = get_condition(store_condition([], view, 3, NOW), STORE_READY)
    assert c is not None and c.status == "False" and c.reason == reason and c.observed_generation == 3


def test_condition_is_absent_while_the_store_never_had_a_problem_and_clears_once_bound() -> None:
    assert store_condition([], None, 1, NOW) == []
    bound = StoreClaimView.from_k8s("ns", "c", _pvc("Bound"), [])
    assert store_condition([], bound, 1, NOW) == []
    down = store_condition([], pending(), 1, NOW)
    up = get_condition(store_condition(down, bound, 2, NOW + 5), STORE_READY)
    assert up is not None and up.status == "True" and up.reason == StoreReason.CLAIM_BOUND


def _blocked(status: TRTEngineStatus | None = None) -> StoreBlockedEngine:
    return StoreBlockedEngine("team-a", "resnet", 2, status or TRTEngineStatus(), {}, pending(), NOW)


def test_blocked_engine_plan_writes_store_ready_and_ready_false_and_warns_once() -> None:
    plan = plan_engine_pass(_blocked(), CFG)
    assert plan == plan_store_blocked(_blocked())
    (write,) = plan.of(WriteStatus)
    store = get_condition(write.status.conditions, STORE_READY)
    ready = get_condition(write.status.conditions, "Ready")
    assert store is not None and store.status == "False" and store.reason == StoreReason.CLAIM_PENDING
    assert ready is not None and ready.status == "False" and ready.reason == StoreReason.CLAIM_PENDING
    (emit,) = plan.of(Emit)
    assert emit.on_status_change and emit.event.type == "Warning" and "missing-class" in emit.event.message
    # The same claim on the next pass: the same status, so nothing to write (no churn).
    again = plan_store_blocked(_blocked(write.status)).of(WriteStatus)[0].status
    assert again == write.status


def test_a_full_pass_after_the_claim_binds_turns_store_ready_true() -> None:
    blocked = plan_store_blocked(_blocked()).of(WriteStatus)[0].status
    obs = observe(engine([{"gpu": H100.gpu}]))
    obs = dataclasses.replace(obs, status=blocked, generation=2)
    (write,) = plan_engine(obs, CFG).of(WriteStatus)
    c = get_condition(write.status.conditions, STORE_READY)
    assert c is not None and c.status == "True" and c.reason == StoreReason.CLAIM_BOUND
    ready = get_condition(write.status.conditions, "Ready")
    assert ready is not None and ready.reason != StoreReason.CLAIM_PENDING
