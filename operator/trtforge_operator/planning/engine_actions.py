"""What a TRTEngine plan asks for: typed, immutable actions, carried out by one applier (apply/engine.py).

A plan is data: no callables, no API objects. Each action names one write of one child kind, so the
applier is the only writer of build and verify Jobs and of the TRTEngine's status and Events
(docs/design.md §"One writer per child").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from trtforge.contract.possession import VerifyGrant
from trtforge_operator.api import TRTEngineStatus
from trtforge_operator.observe.views import Reported
from trtforge_operator.planning.events import Event
from trtforge_operator.planning.target_state import RefusedTransition


class JobPurpose(StrEnum):
    BUILD = "build"  # a first build or a retry, in the build namespace
    REBUILD = "rebuild"  # a rebuild after a GPU fault or a tenant's ask, in the build namespace


class DeleteReason(StrEnum):
    RELEASED = "released"  # its last requester was deleted (planning/cleanup.py)
    EXPIRED = "expired"  # finished, past its TTL, recorded by every requester (planning/finished_jobs.py)


@dataclass(frozen=True)
class CreateJob:
    """Create a build Job if absent; it holds a build slot (admitted with the plan)."""

    job: Mapping[str, Any]
    purpose: JobPurpose

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])


@dataclass(frozen=True)
class CreateVerifyJob:
    """Create a verify Job in the tenant's namespace, after the operator's record of it (`grant`)."""

    job: Mapping[str, Any]
    grant: VerifyGrant

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])


@dataclass(frozen=True)
class AddRequester:
    """Name `requester` (`namespace/name`) on the existing build Job `job` (the Job is shared)."""

    job: str
    requester: str


@dataclass(frozen=True)
class DropRequester:
    """Remove `requester`'s annotation from the build Job `job` (others still use it)."""

    job: str
    requester: str


@dataclass(frozen=True)
class DeleteJob:
    """Delete the build Job `name` of the build namespace."""

    name: str
    reason: DeleteReason


@dataclass(frozen=True)
class RecordResult:
    """Copy what the build Job's pod reported onto the Job (it outlives its pod)."""

    job: str
    result: Reported


@dataclass(frozen=True)
class WriteStatus:
    """Make the TRTEngine's status `status`, patching from `old` (written only on change)."""

    old: Mapping[str, Any]
    status: TRTEngineStatus


@dataclass(frozen=True)
class Emit:
    """Post `event` on the TRTEngine; with `on_status_change`, only when the status write changed it."""

    event: Event
    on_status_change: bool = False


@dataclass(frozen=True)
class RequeueAfter:
    """Run the next pass within `seconds` (a backoff or a grace period ends)."""

    seconds: float


@dataclass(frozen=True)
class WaitForSlot:
    """A build was refused a slot: wake the engine when one frees (not only at the next resync)."""


EngineAction = (
    CreateJob
    | CreateVerifyJob
    | AddRequester
    | DropRequester
    | DeleteJob
    | RecordResult
    | WriteStatus
    | Emit
    | RequeueAfter
    | WaitForSlot
)


A = TypeVar("A")


@dataclass(frozen=True)
class EnginePlan:
    """One pass's decisions: the actions in the order they are applied, and what it refused."""

    actions: tuple[EngineAction, ...] = ()
    refused: tuple[RefusedTransition, ...] = field(default=())  # target changes the table refuses

    def of(self, kind: type[A]) -> list[A]:
        """The actions of one kind, in order."""
        return [a for a in self.actions if isinstance(a, kind)]

    @property
    def status(self) -> TRTEngineStatus:
        """The status the plan writes (a plan always writes one)."""
        (w,) = self.of(WriteStatus)
        return w.status

    @property
    def jobs_to_create(self) -> list[Mapping[str, Any]]:
        return [a.job for a in self.of(CreateJob)]

    @property
    def verify_jobs_to_create(self) -> list[Mapping[str, Any]]:
        return [a.job for a in self.of(CreateVerifyJob)]

    @property
    def verify_grants(self) -> dict[str, VerifyGrant]:
        return {a.name: a.grant for a in self.of(CreateVerifyJob)}

    @property
    def add_requester(self) -> list[str]:
        return [a.job for a in self.of(AddRequester)]

    @property
    def events(self) -> list[Event]:
        return [a.event for a in self.of(Emit)]

    @property
    def requeue_after(self) -> float | None:
        waits = [a.seconds for a in self.of(RequeueAfter)]
        return min(waits) if waits else None

    @property
    def waiting_for_slot(self) -> bool:
        return bool(self.of(WaitForSlot))
