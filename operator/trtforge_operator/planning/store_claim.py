"""The StoreReady condition: whether the engine store's claim is bound, and what to do when it is not
(docs/design.md §"Store claim that cannot bind"). Pure.

Decisions read the claim's typed phase only; the claim's Event is quoted in the message, never read."""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from trtforge_operator.api import Condition, TRTEngineStatus, set_condition
from trtforge_operator.observe.claim_view import ClaimPhase, StoreBlockedEngine, StoreClaimView
from trtforge_operator.planning.engine_actions import Emit, EnginePlan, WriteStatus
from trtforge_operator.planning.events import Event
from trtforge_operator.planning.text import one_line, timestamp

STORE_READY = "StoreReady"  # condition type
STORE_ACCESS_MODE = "ReadWriteMany"  # build Jobs, the broker and verify uploads share the store


class StoreReason(StrEnum):
    CLAIM_PENDING = "StoreClaimPending"
    CLAIM_MISSING = "StoreClaimMissing"
    CLAIM_LOST = "StoreClaimLost"
    CLAIM_BOUND = "StoreClaimBound"


_REASONS = {
    ClaimPhase.PENDING: StoreReason.CLAIM_PENDING,
    ClaimPhase.MISSING: StoreReason.CLAIM_MISSING,
    ClaimPhase.LOST: StoreReason.CLAIM_LOST,
    ClaimPhase.BOUND: StoreReason.CLAIM_BOUND,
}

REMEDY = (
    "give the claim a StorageClass that offers ReadWriteMany (the chart's store.pvc.storageClassName), "
    "or a ReadWriteMany PersistentVolume it can bind, or use an s3:// store (docs/install.md, "
    "Engine store)"
)


def claim_reason(claim: StoreClaimView) -> StoreReason:
    return _REASONS[claim.phase]


def claim_message(claim: StoreClaimView) -> str:
    """Why the store's claim cannot be used, for people: the claim, its StorageClass, the access mode
    it needs, its latest Event and what to do."""
    where = f"the engine store's claim {claim.namespace}/{claim.name}"
    sc = (
        f'StorageClass "{claim.storage_class}"'
        if claim.storage_class
        else "the cluster's default StorageClass (it names none, and there was no default when it was made)"
        if claim.storage_class is None
        else 'no StorageClass (storageClassName "")'
    )
    modes = ", ".join(claim.access_modes) or STORE_ACCESS_MODE
    if claim.phase is ClaimPhase.MISSING:
        head = f"{where} does not exist; create it ({STORE_ACCESS_MODE}) or let the chart create it"
    elif claim.phase is ClaimPhase.LOST:
        head = f"{where} is Lost: its PersistentVolume is gone; it asks for {modes} from {sc}"
    else:
        head = f"{where} is Pending: it asks for {modes} from {sc}, and nothing has provisioned or bound it"
    event = f"; latest event {claim.event_reason}: {claim.event_message or ''}" if claim.event_reason else ""
    return one_line(f"{head}{event}; {REMEDY}", 1000)


def store_condition(
    conditions: Sequence[Condition], claim: StoreClaimView | None, generation: int, now: float
) -> list[Condition]:
    """StoreReady: False while the claim is not bound; True once it is, where it was False before;
    absent while the store never had a problem (an s3:// store never has this condition)."""
    conds = list(conditions)
    bound = claim is None or claim.bound
    if bound and not any(c.type == STORE_READY for c in conds):
        return conds
    at = timestamp(now)
    if bound:
        return set_condition(
            conds, STORE_READY, "True", StoreReason.CLAIM_BOUND, "", observed_generation=generation, at=at
        )
    assert claim is not None
    return set_condition(
        conds,
        STORE_READY,
        "False",
        claim_reason(claim),
        claim_message(claim),
        observed_generation=generation,
        at=at,
    )


def plan_store_blocked(obs: StoreBlockedEngine) -> EnginePlan:
    """A TRTEngine whose store's claim is not bound: StoreReady and Ready say why (a Warning Event
    when that changes); its targets keep what they had; no Job starts until the claim binds."""
    reason, message = claim_reason(obs.claim), claim_message(obs.claim)
    conds = store_condition(obs.status.conditions, obs.claim, obs.generation, obs.now)
    conds = set_condition(
        conds, "Ready", "False", reason, message, observed_generation=obs.generation, at=timestamp(obs.now)
    )
    status = TRTEngineStatus(
        observed_generation=obs.generation,
        conditions=conds,
        targets=list(obs.status.targets),
        ready_targets=obs.status.ready_targets,
        model=obs.status.model,
        checkpoint=obs.status.checkpoint,
    )
    return EnginePlan(
        actions=(
            WriteStatus(obs.status_wire, status),
            Emit(Event("Warning", reason, message), on_status_change=True),
        )
    )
