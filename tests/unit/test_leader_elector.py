"""The election loop (trtforge_operator.leader.elector/runner) over an in-memory Lease with the
apiserver's optimistic concurrency (resourceVersion, 409). Short durations keep the tests quick; no
assertion is on elapsed time, only on order and outcome. The real apiserver is exercised by
tests/integration/test_ha.py."""

from __future__ import annotations

import asyncio
import time

import pytest
from trtforge_operator.config import LeaderElectionSettings
from trtforge_operator.leader.elector import Elector, LeadershipLost, LeaseConflict
from trtforge_operator.leader.lease import LeaseRecord, Verdict, still_leading
from trtforge_operator.leader.runner import LEASE_LOST_EXIT_CODE, replica_identity, run_while_leading

FAST = LeaderElectionSettings(lease_duration_seconds=2, renew_deadline_seconds=1.0, retry_period_seconds=0.2)


class MemoryLease:
    """One Lease object; `broken` makes every call fail like an unreachable apiserver."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.rv = 0
        self.broken = False
        self.writes: list[tuple[float, str]] = []  # (monotonic time, holder) of each accepted write
        self.reads = 0

    def _check(self) -> None:
        if self.broken:
            raise ConnectionRefusedError("apiserver unreachable")

    async def read(self, timeout: float) -> tuple[LeaseRecord, str] | None:
        await asyncio.sleep(0)
        self._check()
        self.reads += 1
        return None if self.record is None else (self.record, str(self.rv))

    async def create(self, record: LeaseRecord, timeout: float) -> str:
        await asyncio.sleep(0)
        self._check()
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    async def replace(self, record: LeaseRecord, resource_version: str, timeout: float) -> str:
        await asyncio.sleep(0)
        self._check()
        if resource_version != str(self.rv):
            raise LeaseConflict("stale")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> str:
        self.record, self.rv = record, self.rv + 1
        self.writes.append((time.monotonic(), record.holder))
        return str(self.rv)


class PerReplica:
    """A replica's own view of the shared Lease: its link to the apiserver can be cut alone."""

    def __init__(self, lease: MemoryLease) -> None:
        self.lease, self.cut = lease, False

    async def read(self, timeout: float) -> tuple[LeaseRecord, str] | None:
        if self.cut:
            raise ConnectionResetError("partitioned")
        return await self.lease.read(timeout)

    async def create(self, record: LeaseRecord, timeout: float) -> str:
        if self.cut:
            raise ConnectionResetError("partitioned")
        return await self.lease.create(record, timeout)

    async def replace(self, record: LeaseRecord, resource_version: str, timeout: float) -> str:
        if self.cut:
            raise ConnectionResetError("partitioned")
        return await self.lease.replace(record, resource_version, timeout)


@pytest.mark.asyncio
async def test_first_creates_second_waits() -> None:
    lease = MemoryLease()
    a, b = Elector(lease, "a", FAST), Elector(lease, "b", FAST)
    assert await a.attempt(1.0) is Verdict.CREATE
    assert await b.attempt(1.0) is Verdict.WAIT
    assert await a.attempt(1.0) is Verdict.RENEW
    assert a.leading() and not b.leading()
    assert lease.record is not None and lease.record.holder == "a"


@pytest.mark.asyncio
async def test_racing_candidates_one_wins() -> None:
    lease = MemoryLease()
    results = await asyncio.gather(
        *(Elector(lease, n, FAST).attempt(1.0) for n in "abc"), return_exceptions=True
    )
    winners = [r for r in results if r is Verdict.CREATE]
    assert len(winners) == 1
    assert all(isinstance(r, LeaseConflict) for r in results if r is not Verdict.CREATE)


@pytest.mark.asyncio
async def test_partitioned_holder_stops_before_the_other_takes_over() -> None:
    lease = MemoryLease()
    link_a = PerReplica(lease)
    a, b = Elector(link_a, "a", FAST), Elector(lease, "b", FAST)
    stop = asyncio.Event()
    assert await a.acquire(stop)
    keeper = asyncio.create_task(a.keep(stop))
    candidate = asyncio.create_task(b.acquire(stop))
    await asyncio.sleep(FAST.retry_period_seconds * 3)
    assert not candidate.done()  # a renews: b waits
    link_a.cut = True
    with pytest.raises(LeadershipLost):
        await keeper
    a_stopped = time.monotonic()
    assert not a.leading()
    assert lease.record is not None and lease.record.holder == "a"  # b has not taken over yet
    assert await candidate
    b_took_over = next(t for t, h in lease.writes if h == "b")
    assert a_stopped < b_took_over
    assert lease.record.transitions == 1


@pytest.mark.asyncio
async def test_holder_that_sees_another_holder_gives_up_at_once() -> None:
    lease = MemoryLease()
    a = Elector(lease, "a", FAST)
    stop = asyncio.Event()
    assert await a.acquire(stop)
    assert lease.record is not None
    # Someone (an admin, a replica with a skewed view) wrote another holder into the Lease.
    await lease.replace(LeaseRecord("z", 15, None, None, 1), str(lease.rv), 1.0)
    with pytest.raises(LeadershipLost, match="'z'"):
        await a.keep(stop)


@pytest.mark.asyncio
async def test_a_leader_renews_with_one_update_and_no_read() -> None:
    lease = MemoryLease()
    a = Elector(lease, "a", FAST)
    assert await a.attempt(1.0) is Verdict.CREATE
    reads, writes = lease.reads, len(lease.writes)
    for _ in range(3):
        assert await a.attempt(1.0) is Verdict.RENEW
    assert lease.reads == reads  # client-go's fast path: the cached resourceVersion guards the write
    assert len(lease.writes) == writes + 3
    assert a.leading() and lease.record is not None and lease.record.holder == "a"


@pytest.mark.asyncio
async def test_a_renew_that_conflicts_reads_and_decides_in_the_same_attempt() -> None:
    lease = MemoryLease()
    a = Elector(lease, "a", FAST)
    assert await a.attempt(1.0) is Verdict.CREATE
    assert lease.record is not None
    # Someone else wrote the Lease (still naming a): the update on the old version gets 409, the
    # replica reads, sees itself, and renews on the new version.
    await lease.replace(lease.record, str(lease.rv), 1.0)
    reads = lease.reads
    assert await a.attempt(1.0) is Verdict.RENEW
    assert lease.reads == reads + 1
    # Another holder was written: the update conflicts, the read shows it, the replica waits.
    await lease.replace(LeaseRecord("z", 15, None, None, 1), str(lease.rv), 1.0)
    assert await a.attempt(1.0) is Verdict.WAIT
    assert lease.record.holder == "z"


@pytest.mark.asyncio
async def test_release_hands_over_without_waiting_a_lease_duration() -> None:
    lease = MemoryLease()
    a, b = Elector(lease, "a", FAST), Elector(lease, "b", FAST)
    assert await a.attempt(1.0) is Verdict.CREATE
    assert await b.attempt(1.0) is Verdict.WAIT
    assert await a.release()
    assert not a.leading()
    assert await b.attempt(1.0) is Verdict.TAKE_OVER


@pytest.mark.asyncio
async def test_api_errors_while_waiting_keep_the_candidate_trying() -> None:
    lease = MemoryLease()
    lease.broken = True
    a = Elector(lease, "a", FAST)
    stop = asyncio.Event()
    task = asyncio.create_task(a.acquire(stop))
    await asyncio.sleep(FAST.retry_period_seconds * 2)
    assert not task.done()
    lease.broken = False
    assert await task
    assert a.leading()


@pytest.mark.asyncio
async def test_runner_acts_only_while_leading_and_stops_when_renewal_fails() -> None:
    lease = MemoryLease()
    other = Elector(lease, "other", FAST)
    assert await other.attempt(1.0) is Verdict.CREATE  # someone else leads first
    link = PerReplica(lease)
    me = Elector(link, "me", FAST)
    events: list[str] = []
    lost: list[str] = []

    async def act(stop: asyncio.Event) -> None:
        events.append(f"act-start leading={me.leading()}")
        try:
            await stop.wait()
        finally:
            events.append(f"act-end leading={me.leading()}")

    runner = asyncio.create_task(run_while_leading(me, act, on_lost=lost.append, stop=asyncio.Event()))
    await asyncio.sleep(FAST.retry_period_seconds * 2)
    assert events == []  # idle while another holds the Lease
    assert await other.release()
    while not events:
        await asyncio.sleep(0.05)
    assert events == ["act-start leading=True"]
    link.cut = True
    assert await runner == LEASE_LOST_EXIT_CODE
    assert lost and ("renew" in lost[0] or "watchdog" in lost[0])
    assert not still_leading(time.monotonic(), me.last_renew_sent, FAST.renew_deadline_seconds)


@pytest.mark.asyncio
async def test_runner_stops_on_request_and_releases() -> None:
    lease = MemoryLease()
    me = Elector(lease, "me", FAST)
    stop = asyncio.Event()
    seen: list[bool] = []

    async def act(act_stop: asyncio.Event) -> None:
        await act_stop.wait()

    runner = asyncio.create_task(run_while_leading(me, act, on_leading=seen.append, stop=stop))
    while True not in seen:
        await asyncio.sleep(0.05)
    stop.set()
    assert await runner == 0
    assert seen == [False, True, False]
    assert lease.record is not None and lease.record.holder == ""


def test_identity_is_unique_per_process_unless_fixed() -> None:
    one = replica_identity({"POD_NAME": "trtforge-7d9f-abc"})
    two = replica_identity({"POD_NAME": "trtforge-7d9f-abc"})
    assert one.startswith("trtforge-7d9f-abc_") and one != two  # a restarted container is a new candidate
    assert replica_identity({}) != replica_identity({})
    assert replica_identity({"TRTFORGE_LEADER_IDENTITY": "local-op", "POD_NAME": "p"}) == "local-op"


@pytest.mark.asyncio
async def test_healthz_is_ok_on_leader_and_standby() -> None:
    from aiohttp.test_utils import TestClient, TestServer
    from trtforge_operator.health import health_app

    leading = [False]
    async with TestClient(TestServer(health_app("pod-a_1234", lambda: leading[0]))) as c:
        r = await c.get("/healthz")
        assert r.status == 200 and await r.json() == {"identity": "pod-a_1234", "leader": False}
        leading[0] = True
        assert (await (await c.get("/healthz")).json())["leader"] is True
