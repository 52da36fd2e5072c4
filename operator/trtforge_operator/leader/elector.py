"""The leader-election loop: applies `lease`'s decisions to a Lease through the apiserver.

`Elector.acquire` tries every retry period (jittered) until this replica holds the Lease;
`Elector.keep` renews it every retry period and raises `LeadershipLost` as soon as a renew has not
succeeded within the renew deadline, or another replica holds the Lease. A holder renews only what
it read: every write carries the resourceVersion it read, so two replicas racing for an expired Lease
cannot both win (the loser gets 409).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException

from trtforge.logs import fields
from trtforge_operator.config import LeaderElectionSettings
from trtforge_operator.leader.lease import (
    LeaseRecord,
    Observed,
    Verdict,
    jittered,
    next_record,
    observe,
    released,
    renew_in_place,
    still_leading,
    verdict,
)

log = logging.getLogger(__name__)


class LeaseConflict(Exception):
    """The Lease changed since we read it (409): someone else wrote first."""


class LeadershipLost(Exception):
    """This replica could not renew within the renew deadline, or another replica holds the Lease."""


class LeaseAPI(Protocol):
    """The three Lease calls election needs; `timeout` bounds each call (seconds)."""

    async def read(self, timeout: float) -> tuple[LeaseRecord, str] | None: ...

    async def create(self, record: LeaseRecord, timeout: float) -> str: ...

    async def replace(self, record: LeaseRecord, resource_version: str, timeout: float) -> str: ...


class KubeLeaseAPI:
    """coordination.k8s.io/v1 Lease `namespace/name` through its own API client (its own connections)."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.api = client.CoordinationV1Api(api)
        self.namespace, self.name = namespace, name

    async def read(self, timeout: float) -> tuple[LeaseRecord, str] | None:
        try:
            resp: Any = await asyncio.to_thread(
                self.api.read_namespaced_lease,
                self.name,
                self.namespace,
                _preload_content=False,
                _request_timeout=timeout,
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        body = json.loads(resp.data)
        return LeaseRecord.from_spec(body.get("spec")), str(body["metadata"]["resourceVersion"])

    def _body(self, record: LeaseRecord, resource_version: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": record.to_spec(),
        }

    async def _write(self, fn: Any, *args: Any, timeout: float) -> str:
        try:
            resp = await asyncio.to_thread(fn, *args, _preload_content=False, _request_timeout=timeout)
        except ApiException as e:
            if e.status == 409:
                raise LeaseConflict(f"Lease {self.namespace}/{self.name} changed under us") from e
            raise
        return str(json.loads(resp.data)["metadata"]["resourceVersion"])

    async def create(self, record: LeaseRecord, timeout: float) -> str:
        return await self._write(
            self.api.create_namespaced_lease, self.namespace, self._body(record, None), timeout=timeout
        )

    async def replace(self, record: LeaseRecord, resource_version: str, timeout: float) -> str:
        return await self._write(
            self.api.replace_namespaced_lease,
            self.name,
            self.namespace,
            self._body(record, resource_version),
            timeout=timeout,
        )


def _utc_now() -> datetime:
    return datetime.now(UTC)


class Elector:
    """One replica's side of the election. `on_observe(record)` hears every record read or written."""

    def __init__(
        self,
        api: LeaseAPI,
        identity: str,
        settings: LeaderElectionSettings,
        on_observe: Callable[[LeaseRecord], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utc_now,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.api, self.identity, self.settings = api, identity, settings
        self.on_observe = on_observe
        self.clock, self.wall, self.draw = clock, wall, draw
        self.seen: Observed | None = None
        self.resource_version: str | None = None
        self.last_renew_sent: float | None = None  # monotonic; set only by our own successful writes

    @property
    def deadline(self) -> float | None:
        """Monotonic time at which this replica must have stopped acting; None when it never led."""
        if self.last_renew_sent is None:
            return None
        return self.last_renew_sent + self.settings.renew_deadline_seconds

    def leading(self) -> bool:
        return still_leading(self.clock(), self.last_renew_sent, self.settings.renew_deadline_seconds)

    async def attempt(self, timeout: float) -> Verdict:
        """One tryAcquireOrRenew. Returns the verdict it acted on (WAIT: another replica holds it).

        While leading, a renew is a single update on the resourceVersion this replica last wrote
        (`renew_in_place`); on a conflict it falls back to a read and a decision, in the same attempt.
        Raises on API errors and on LeaseConflict (another replica wrote first).
        """
        started = self.clock()  # a renew counts from before it is sent: earlier than anyone can see it
        if renew_in_place(self.identity, self.seen, self.resource_version, self.leading()):
            assert self.seen is not None and self.resource_version is not None
            record = next_record(
                Verdict.RENEW,
                self.identity,
                self.seen.record,
                self.wall(),
                self.settings.lease_duration_seconds,
            )
            assert record is not None
            try:
                rv = await self.api.replace(record, self.resource_version, timeout)
            except LeaseConflict:
                log.debug("the lease changed since our last renew; reading it")
            else:
                self._wrote(record, rv, started)
                return Verdict.RENEW
        got = await self.api.read(max(0.1, timeout - (self.clock() - started)))
        now = self.clock()
        if got is None:
            self.seen, self.resource_version = None, None
        else:
            self.seen, self.resource_version = observe(self.seen, got[0], now), got[1]
            if self.on_observe is not None:
                self.on_observe(got[0])
        v = verdict(self.identity, self.seen, now)
        current = self.seen.record if self.seen is not None else None
        record = next_record(v, self.identity, current, self.wall(), self.settings.lease_duration_seconds)
        if record is None:
            return v
        remaining = max(0.1, timeout - (self.clock() - started))
        if v is Verdict.CREATE or self.resource_version is None:
            rv = await self.api.create(record, remaining)
        else:
            rv = await self.api.replace(record, self.resource_version, remaining)
        self._wrote(record, rv, started)
        return v

    def _wrote(self, record: LeaseRecord, resource_version: str, sent: float) -> None:
        """Our write of `record` was accepted; it counts as a renew from when it was `sent`."""
        self.seen, self.resource_version = Observed(record, self.clock()), resource_version
        self.last_renew_sent = sent
        if self.on_observe is not None:
            self.on_observe(record)

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Try until this replica holds the Lease (True) or `stop` is set (False)."""
        s = self.settings
        while not stop.is_set():
            try:
                v = await self.attempt(timeout=s.renew_deadline_seconds)
                if v is not Verdict.WAIT:
                    log.info(
                        "acquired the lease",
                        extra=fields(identity=self.identity, verdict=v.value, lease=s.lease_name),
                    )
                    return True
            except LeaseConflict:
                log.debug("lost a race for the lease")
            except Exception as e:
                log.warning("could not read or write the lease", extra=fields(error=_short(e)))
            await _wait(stop, jittered(s.retry_period_seconds, self.draw()))
        return False

    async def keep(self, stop: asyncio.Event) -> None:
        """Renew every retry period until `stop` is set; raise LeadershipLost when renewing fails."""
        s = self.settings
        while not stop.is_set():
            await _wait(stop, s.retry_period_seconds)
            if stop.is_set():
                return
            while True:
                deadline = self.deadline
                remaining = (deadline or 0.0) - self.clock()
                if remaining <= 0:
                    raise LeadershipLost(
                        f"no successful renew within renew_deadline_seconds={s.renew_deadline_seconds}"
                    )
                try:
                    v = await asyncio.wait_for(self.attempt(timeout=remaining), remaining)
                except TimeoutError:
                    continue
                except LeaseConflict:
                    v = None
                except Exception as e:
                    log.warning("renewing the lease failed", extra=fields(error=_short(e)))
                    v = None
                if v is Verdict.WAIT:
                    holder = self.seen.record.holder if self.seen else ""
                    raise LeadershipLost(f"the lease is held by {holder!r}")
                if v is not None:
                    break  # renewed
                await _wait(stop, min(s.retry_period_seconds, max(0.0, (self.deadline or 0) - self.clock())))

    async def release(self, timeout: float = 2.0) -> bool:
        """Give the Lease up (holder "" and 1 s) if we still hold it, so a candidate takes over at once."""
        try:
            got = await self.api.read(timeout)
            if got is None or got[0].holder != self.identity:
                return False
            await self.api.replace(released(got[0], self.wall()), got[1], timeout)
        except Exception as e:
            log.warning("could not release the lease", extra=fields(error=_short(e)))
            return False
        self.last_renew_sent = None
        log.info("released the lease", extra=fields(identity=self.identity))
        return True


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds` or until `stop` is set."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, seconds))
    except TimeoutError:
        pass


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__
