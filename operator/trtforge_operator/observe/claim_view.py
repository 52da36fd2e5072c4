"""Typed views of the engine store's claim (gathered by observe/store_claim.py): data only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from trtforge_operator.api import TRTEngineStatus


class ClaimPhase(StrEnum):
    """A PersistentVolumeClaim's ``status.phase``, and MISSING where there is no such claim."""

    BOUND = "Bound"
    PENDING = "Pending"
    LOST = "Lost"
    MISSING = "Missing"

    @classmethod
    def of(cls, phase: object) -> ClaimPhase:
        try:
            return cls(str(phase))
        except ValueError:
            return cls.PENDING  # no phase yet: not bound


@dataclass(frozen=True)
class StoreClaimView:
    """The store's claim as the apiserver has it: what a policy needs to say why it does not bind."""

    namespace: str
    name: str
    phase: ClaimPhase
    storage_class: str | None = None  # spec.storageClassName; None: the cluster's default StorageClass
    access_modes: tuple[str, ...] = ()
    event_reason: str | None = None  # its latest Event (ProvisioningFailed, WaitForFirstConsumer, ...)
    event_message: str | None = None

    @property
    def bound(self) -> bool:
        return self.phase is ClaimPhase.BOUND

    @classmethod
    def from_k8s(
        cls, namespace: str, name: str, pvc: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]]
    ) -> StoreClaimView:
        """The view of claim `namespace/name` (`pvc` None: it does not exist) and its Events."""
        latest = max(events, key=_event_time, default=None)
        reason = str(latest.get("reason") or "") or None if latest is not None else None
        message = str(latest.get("message") or "") or None if latest is not None else None
        if pvc is None:
            return cls(namespace, name, ClaimPhase.MISSING, event_reason=reason, event_message=message)
        spec = pvc.get("spec") or {}
        return cls(
            namespace,
            name,
            ClaimPhase.of((pvc.get("status") or {}).get("phase")),
            storage_class=spec.get("storageClassName"),
            access_modes=tuple(str(m) for m in spec.get("accessModes") or ()),
            event_reason=reason,
            event_message=message,
        )


@dataclass(frozen=True)
class StoreBlockedEngine:
    """A TRTEngine whose pass cannot read the store: the store's claim is not bound."""

    namespace: str
    name: str
    generation: int
    status: TRTEngineStatus
    status_wire: Mapping[str, Any]
    claim: StoreClaimView
    now: float


def store_claim_name(store_uri: str) -> str | None:
    """The claim a ``pvc://<claim>/...`` store lives on; None for any other store."""
    if not store_uri.startswith("pvc://"):
        return None
    return store_uri.removeprefix("pvc://").partition("/")[0] or None


def _event_time(event: Mapping[str, Any]) -> str:
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("metadata") or {}).get("creationTimestamp")
        or ""
    )
