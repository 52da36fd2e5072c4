"""The supervisor's decisions, pure: what the server's health answer means, whether the pod is ready,
whether it is alive, and what to do about a dead or stuck server (docs/design.md §"LLM serving").

The process layer (:mod:`trtforge_runtime.llm.supervisor`) observes the server (its health answer,
whether its process still runs, the canary's outcome) into a :class:`Observation` and applies the
:class:`Verdict` that :func:`decide` returns; nothing here reads a clock, a socket or a process.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Health(enum.Enum):
    """What one health request to the server said."""

    UP = "up"  # 200
    STARTING = "starting"  # 503 that the server marks as start-up (model loading)
    UNAVAILABLE = "unavailable"  # 503 for any other reason: the state issue #18663 can leave forever
    DOWN = "down"  # no answer: connection refused or timed out
    ERROR = "error"  # any other status


class Action(enum.Enum):
    """What the supervisor does next."""

    WAIT = "wait"  # keep watching
    ABORT = "abort"  # end the pod with a termination message: the kubelet restarts it


class Cause(enum.Enum):
    """Why the pod is not live (the reason in its termination message and logs)."""

    SERVER_EXITED = "server process exited"
    STUCK_UNAVAILABLE = "server answered 503 past the grace period"
    START_TIMEOUT = "server did not become healthy within the start-up limit"
    UNREACHABLE = "server stopped answering its health endpoint past the grace period"
    RANK_LOST = "a rank of the group is gone"  # trtforge_runtime.llm.ranks
    RANKS_MISSING = "the group's ranks did not meet"


@dataclass(frozen=True)
class Policy:
    """Grace periods, in seconds."""

    # A running server may answer 503 or not at all this long before liveness fails (TensorRT-LLM
    # issue #18663: after a rank crash trtllm-serve answers 503 for ever).
    unavailable_grace_s: float = 30.0
    # The first healthy answer must come within this long of the server's start (model loading).
    start_limit_s: float = 600.0


@dataclass(frozen=True)
class Observation:
    """What the process layer saw at `now` (seconds on a monotonic clock)."""

    now: float
    started_at: float  # when the server process started
    process_alive: bool
    exit_code: int | None  # the server's exit status once it has exited
    health: Health
    # When the current run of not-UP answers began, after the server had been UP at least once
    # (None while it is UP, or while it has never been UP).
    unhealthy_since: float | None
    ever_up: bool
    canary_passed: bool


@dataclass(frozen=True)
class Verdict:
    ready: bool
    live: bool
    action: Action
    cause: Cause | None = None
    detail: str = ""


def next_unhealthy_since(prev: float | None, health: Health, ever_up: bool, now: float) -> float | None:
    """The start of the current run of not-UP answers after the server was UP once (None: none)."""
    if health is Health.UP or not ever_up:
        return None
    return prev if prev is not None else now


def ready(health: Health, canary_passed: bool) -> bool:
    """Ready: the server says it is healthy and the canary's greedy tokens matched the golden ones."""
    return health is Health.UP and canary_passed


def decide(obs: Observation, policy: Policy) -> Verdict:
    """Readiness, liveness and the action for one observation."""
    is_ready = obs.process_alive and ready(obs.health, obs.canary_passed)
    if not obs.process_alive:
        return Verdict(
            False,
            False,
            Action.ABORT,
            Cause.SERVER_EXITED,
            f"the server process exited with status {obs.exit_code}",
        )
    if not obs.ever_up:
        waited = obs.now - obs.started_at
        if waited > policy.start_limit_s:
            return Verdict(
                False,
                False,
                Action.ABORT,
                Cause.START_TIMEOUT,
                f"no healthy answer {waited:.0f} s after start (limit {policy.start_limit_s:.0f} s); "
                f"last: {obs.health.value}",
            )
        return Verdict(is_ready, True, Action.WAIT)
    if obs.unhealthy_since is not None:
        stuck = obs.now - obs.unhealthy_since
        if stuck > policy.unavailable_grace_s:
            cause = Cause.UNREACHABLE if obs.health is Health.DOWN else Cause.STUCK_UNAVAILABLE
            return Verdict(
                False,
                False,
                Action.ABORT,
                cause,
                f"health has been {obs.health.value} for {stuck:.0f} s "
                f"(grace {policy.unavailable_grace_s:.0f} s)",
            )
    return Verdict(is_ready, True, Action.WAIT)
