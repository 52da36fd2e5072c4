"""Pure decisions of leader election, after client-go's leaderelection package.

Times come in two clocks: wall-clock UTC datetimes are what the Lease records (acquireTime,
renewTime: for people and other tools), while every decision uses this process's own monotonic clock,
as client-go does. A candidate never compares its clock with the holder's: it takes over only when
the record it sees has not changed for a whole lease duration *as measured by itself* since it first
saw that record. The holder, in turn, stops acting when its last successful renew, counted from the
moment it *sent* that renew, is older than the renew deadline. Since a candidate can only have seen
that record after it was sent, and renew deadline < lease duration, the two never act at once.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

# client-go's JitterFactor: a candidate waits retry_period * [1, 1.2) between attempts.
JITTER_FACTOR = 1.2


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """The part of a Lease's spec leader election reads and writes. `holder` "" means released."""

    holder: str
    duration_s: int
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> LeaseRecord:
        """From a Lease's `spec` as JSON (camelCase keys, RFC 3339 times)."""
        spec = spec or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=_parse_time(spec.get("acquireTime")),
            renew_time=_parse_time(spec.get("renewTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> dict[str, Any]:
        """The Lease `spec` as JSON; MicroTime wants microseconds and a zone."""
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": _format_time(self.acquire_time),
            "renewTime": _format_time(self.renew_time),
            "leaseTransitions": self.transitions,
        }


def _parse_time(v: Any) -> datetime | None:
    if v is None or v == "":
        return None
    if isinstance(v, datetime):
        return v if v.tzinfo else v.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(v).replace("Z", "+00:00"))


def _format_time(t: datetime | None) -> str | None:
    if t is None:
        return None
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class Observed:
    """A record as this replica last saw it, and when (monotonic) it first saw it in that form."""

    record: LeaseRecord
    since: float


def observe(previous: Observed | None, record: LeaseRecord, now: float) -> Observed:
    """What this replica knows after reading `record` at `now`: a changed record restarts the clock.

    A live holder renews every retry period, changing renewTime, so its record keeps restarting the
    candidates' clocks; a dead one leaves the record unchanged until it is a lease duration old.
    """
    if previous is not None and previous.record == record:
        return previous
    return Observed(record, now)


class Verdict(enum.Enum):
    """What a replica does with the Lease on one attempt."""

    CREATE = "create"  # no Lease exists: create it, holding it
    RENEW = "renew"  # we hold it: bump renewTime
    TAKE_OVER = "take-over"  # released, or its holder stopped renewing a lease duration ago
    WAIT = "wait"  # another replica holds it and renews


def verdict(identity: str, seen: Observed | None, now: float) -> Verdict:
    """client-go's tryAcquireOrRenew, as a decision on what this replica has observed."""
    if seen is None:
        return Verdict.CREATE
    record = seen.record
    if record.holder == identity:
        return Verdict.RENEW
    if not record.holder:
        return Verdict.TAKE_OVER
    if now >= seen.since + record.duration_s:
        return Verdict.TAKE_OVER
    return Verdict.WAIT


def renew_in_place(identity: str, seen: Observed | None, resource_version: str | None, leading: bool) -> bool:
    """client-go's fast path: a leader whose last known record is its own renews with one update on
    the resourceVersion it holds, without reading the Lease first. The apiserver refuses the update
    (409) if anyone wrote since; the caller then reads and decides (`verdict`). False: read first."""
    return leading and resource_version is not None and seen is not None and seen.record.holder == identity


def next_record(
    v: Verdict, identity: str, current: LeaseRecord | None, wall: datetime, duration_s: int
) -> LeaseRecord | None:
    """The record to write for verdict `v` (None: write nothing)."""
    if v is Verdict.WAIT:
        return None
    if v is Verdict.CREATE or current is None:
        return LeaseRecord(identity, duration_s, wall, wall, 0)
    if v is Verdict.RENEW:
        return dataclasses.replace(current, duration_s=duration_s, renew_time=wall)
    return LeaseRecord(identity, duration_s, wall, wall, current.transitions + 1)


def released(current: LeaseRecord, wall: datetime) -> LeaseRecord:
    """What a holder that stops on purpose writes: no holder, so a candidate takes over at once."""
    return LeaseRecord("", 1, wall, wall, current.transitions)


def still_leading(now: float, last_renew_sent: float | None, renew_deadline_s: float) -> bool:
    """True while the last successful renew (from when it was sent) is younger than the deadline."""
    return last_renew_sent is not None and now < last_renew_sent + renew_deadline_s


def jittered(retry_period_s: float, unit: float) -> float:
    """The wait before the next attempt; `unit` in [0, 1) (a random draw)."""
    return retry_period_s * (1.0 + (JITTER_FACTOR - 1.0) * unit)


def timing_problem(lease_duration_s: float, renew_deadline_s: float, retry_period_s: float) -> str | None:
    """client-go's checks on the three durations; None when they are consistent."""
    if lease_duration_s <= renew_deadline_s:
        return (
            f"lease_duration_seconds ({lease_duration_s}) must be greater than renew_deadline_seconds "
            f"({renew_deadline_s}): a holder must give up before a candidate may take over"
        )
    if renew_deadline_s <= JITTER_FACTOR * retry_period_s:
        return (
            f"renew_deadline_seconds ({renew_deadline_s}) must be greater than {JITTER_FACTOR} x "
            f"retry_period_seconds ({retry_period_s}): a holder must get more than one try to renew"
        )
    return None
