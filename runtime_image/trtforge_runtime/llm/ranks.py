"""A rank group's decisions, pure: where the ranks are, whether they have met, what the leader and a
worker report, and when the group is torn down (docs/llm.md §"Groups").

llama.cpp's RPC backend is fragile in three ways that these decisions carry for it: its leader aborts
when a worker is unreachable at start, its ``/health`` stays ok after a worker dies (the next request
aborts the leader), and a worker dies of SIGPIPE when a client connects to its rank port and closes
early. So the leader starts its server only after every rank's supervisor says ready, watches the
ranks through their supervisors (never the rank port), and reports the group not ready and not live
as soon as a rank is gone, without sending its server a request. Nothing here reads a clock, a socket
or a process.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


class RankReport(enum.Enum):
    """What one worker's supervisor said when the leader asked (its probe port, not its rank port)."""

    READY = "ready"  # readiness 200: its rank process listens on the rank port
    NOT_READY = "not ready"  # readiness 503, liveness 200: still starting
    NOT_LIVE = "not live"  # liveness 503: its rank process is gone
    UNREACHABLE = "unreachable"  # no answer: the supervisor (the pod) is gone or not up yet


class GroupAction(enum.Enum):
    WAIT = "wait"  # keep waiting for ranks (before the server starts) or keep serving
    START_SERVER = "start server"  # every rank is ready: start the leader's server with --rpc
    TEAR_DOWN = "tear down"  # a rank is gone: kill the server, report not live, end the pod


@dataclass(frozen=True)
class Worker:
    """A worker rank as the leader reaches it: its rank port (for the server's --rpc) and its
    supervisor's probe port (for the leader's questions)."""

    rank: int
    host: str
    rank_port: int
    probe_port: int

    @property
    def rpc_endpoint(self) -> str:
        return f"{self.host}:{self.rank_port}"

    @property
    def supervisor(self) -> str:
        return f"{self.host}:{self.probe_port}"


@dataclass(frozen=True)
class GroupPolicy:
    """Seconds."""

    # Every rank must be ready this long after the leader started waiting.
    meet_limit_s: float = 600.0
    # A worker's supervisor may be silent this long before the rank counts as gone (one lost answer
    # is not a death); a supervisor that says "not live" is gone at once.
    unreachable_grace_s: float = 2.0


@dataclass(frozen=True)
class RankSeen:
    report: RankReport
    # When the current run of UNREACHABLE answers began (None unless the last answer was one).
    unreachable_since: float | None = None
    # Which run of the worker's supervisor answered (a token it draws at start; None: no answer). A
    # worker restarted between two questions is a process the leader's server never met.
    incarnation: str | None = None


@dataclass(frozen=True)
class GroupVerdict:
    ready: bool  # the group (the ranks) allows readiness; the server's own readiness comes on top
    live: bool
    action: GroupAction
    missing: tuple[int, ...] = ()  # ranks not ready (waiting) or gone (tear down)
    detail: str = ""


def parse_worker(rank: int, text: str) -> Worker:
    """``--worker HOST:RANK_PORT:PROBE_PORT``; ValueError naming the argument."""
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"--worker {text!r}: expected HOST:RANK_PORT:PROBE_PORT")
    try:
        rank_port, probe_port = int(parts[1]), int(parts[2])
    except ValueError as e:
        raise ValueError(f"--worker {text!r}: the ports must be numbers ({e})") from e
    for p in (rank_port, probe_port):
        if not 0 < p < 65536:
            raise ValueError(f"--worker {text!r}: {p} is not a port number")
    return Worker(rank, parts[0], rank_port, probe_port)


def workers_from_args(world_size: int, texts: Sequence[str]) -> list[Worker]:
    """The workers, ranks 1..world_size-1 in the order given; ValueError when the count is wrong."""
    if world_size < 1:
        raise ValueError(f"--world-size {world_size}: must be at least 1")
    if len(texts) != world_size - 1:
        raise ValueError(
            f"--worker given {len(texts)} times for --world-size {world_size}: "
            f"expected one per worker rank ({world_size - 1})"
        )
    return [parse_worker(i + 1, t) for i, t in enumerate(texts)]


def rpc_argument(workers: Iterable[Worker]) -> str:
    """llama-server's ``--rpc`` value: the workers' rank endpoints, in rank order."""
    return ",".join(w.rpc_endpoint for w in sorted(workers, key=lambda w: w.rank))


def classify(live_status: int | None, ready_status: int | None) -> RankReport:
    """A worker supervisor's two probe answers (None: no answer)."""
    if live_status is None:
        return RankReport.UNREACHABLE
    if live_status != 200:
        return RankReport.NOT_LIVE
    return RankReport.READY if ready_status == 200 else RankReport.NOT_READY


def next_seen(
    prev: RankSeen | None, report: RankReport, now: float, incarnation: str | None = None
) -> RankSeen:
    if report is not RankReport.UNREACHABLE:
        return RankSeen(report, incarnation=incarnation)
    since = prev.unreachable_since if prev is not None and prev.unreachable_since is not None else now
    return RankSeen(report, since, prev.incarnation if prev is not None else None)


def _describe(workers: Mapping[int, Worker], seen: Mapping[int, RankSeen], ranks: Iterable[int]) -> str:
    return "; ".join(f"rank {r} ({workers[r].supervisor}): {seen[r].report.value}" for r in ranks)


def before_start(
    workers: Sequence[Worker], seen: Mapping[int, RankSeen], waited_s: float, policy: GroupPolicy
) -> GroupVerdict:
    """The leader before its server runs: start once every rank is ready; until then not ready (live),
    naming the ranks it waits for; past the meet limit, give up (the pod restarts)."""
    by_rank = {w.rank: w for w in workers}
    full = {r: seen.get(r, RankSeen(RankReport.UNREACHABLE)) for r in by_rank}
    missing = tuple(w.rank for w in workers if full[w.rank].report is not RankReport.READY)
    if not missing:
        return GroupVerdict(False, True, GroupAction.START_SERVER)
    detail = f"waiting for {len(missing)} of {len(workers)} worker ranks: {_describe(by_rank, full, missing)}"
    if waited_s > policy.meet_limit_s:
        return GroupVerdict(
            False,
            False,
            GroupAction.TEAR_DOWN,
            missing,
            f"ranks did not meet within {policy.meet_limit_s:.0f} s; {detail}",
        )
    return GroupVerdict(False, True, GroupAction.WAIT, missing, detail)


def while_serving(
    workers: Sequence[Worker],
    seen: Mapping[int, RankSeen],
    now: float,
    policy: GroupPolicy,
    met: Mapping[int, str | None] | None = None,
) -> GroupVerdict:
    """The leader while its server runs: a rank whose supervisor says not live, or is silent past the
    grace, or answers from another run than the one the group met (`met`: rank -> incarnation when the
    server started; it restarted, however quickly), is gone, and the whole group goes with it (no
    group serves with fewer ranks than its mapping). A rank that is merely not ready (still answering)
    keeps the group up but not ready."""
    by_rank = {w.rank: w for w in workers}
    gone: list[int] = []
    shaky: list[int] = []
    for w in workers:
        s = seen.get(w.rank, RankSeen(RankReport.UNREACHABLE, now))
        was = (met or {}).get(w.rank)
        if s.report is RankReport.NOT_LIVE or (was and s.incarnation and s.incarnation != was):
            gone.append(w.rank)
        elif s.report is RankReport.UNREACHABLE:
            since = s.unreachable_since if s.unreachable_since is not None else now
            (gone if now - since > policy.unreachable_grace_s else shaky).append(w.rank)
        elif s.report is RankReport.NOT_READY:
            shaky.append(w.rank)
    full = {r: seen.get(r, RankSeen(RankReport.UNREACHABLE)) for r in by_rank}
    if gone:
        return GroupVerdict(
            False,
            False,
            GroupAction.TEAR_DOWN,
            tuple(gone),
            f"rank lost, the group is torn down: {_describe(by_rank, full, gone)}",
        )
    if shaky:
        return GroupVerdict(False, True, GroupAction.WAIT, tuple(shaky), _describe(by_rank, full, shaky))
    return GroupVerdict(True, True, GroupAction.WAIT)


def worker_ready(process_alive: bool, listening: bool) -> bool:
    """A worker rank is ready when its rank process runs and listens on the rank port, as the kernel's
    socket table says: connecting to the port to find out would kill llama.cpp's RPC server."""
    return process_alive and listening


def listening_ports(proc_net_tcp: str) -> set[int]:
    """The local ports in LISTEN state (``0A``) in a ``/proc/net/tcp`` or ``tcp6`` table."""
    out: set[int] = set()
    for line in proc_net_tcp.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 3 and cols[3] == "0A":
            out.add(int(cols[1].rsplit(":", 1)[1], 16))
    return out


# What a LeaderWorkerSet injects into every container of its pods (sigs.k8s.io/lws
# api/leaderworkerset/v1 and pkg/utils/pod: LWS_LEADER_ADDRESS is <lws>-<group>.<subdomain>.<namespace>;
# worker i of the group is the pod <lws>-<group>-<i> under the same subdomain).
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"


@dataclass(frozen=True)
class Placement:
    rank: int
    world_size: int
    workers: tuple[Worker, ...]  # the leader's workers (empty on a worker)


def from_lws(env: Mapping[str, str], rank_port: int, probe_port: int) -> Placement:
    """This pod's rank, the group's size and (on the leader) its workers, from a LeaderWorkerSet's
    variables; ValueError naming the variable when one is missing or wrong."""
    for name in (LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX):
        if not env.get(name):
            raise ValueError(
                f"--lws: environment variable {name} is not set (is this pod in a LeaderWorkerSet?)"
            )
    try:
        size, rank = int(env[LWS_GROUP_SIZE]), int(env[LWS_WORKER_INDEX])
    except ValueError as e:
        raise ValueError(f"--lws: {LWS_GROUP_SIZE} and {LWS_WORKER_INDEX} must be numbers ({e})") from e
    if not 0 <= rank < size:
        raise ValueError(f"--lws: {LWS_WORKER_INDEX} {rank} is outside the group of {size}")
    leader, _, domain = env[LWS_LEADER_ADDRESS].partition(".")
    if not domain:
        raise ValueError(
            f"--lws: {LWS_LEADER_ADDRESS} {env[LWS_LEADER_ADDRESS]!r}: expected pod.subdomain.namespace"
        )
    workers = (
        ()
        if rank
        else tuple(Worker(i, f"{leader}-{i}.{domain}", rank_port, probe_port) for i in range(1, size))
    )
    return Placement(rank, size, workers)
