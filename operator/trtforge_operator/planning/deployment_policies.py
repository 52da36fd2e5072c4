"""What an InferenceDeployment pass decides, as small named policies over typed facts (docs/design.md
§"Observe, plan, apply"). Pure.

Each chain looks at facts gathered once and either answers or passes; the first answer wins and the
last policy always answers: a target's message (:func:`target_message`), whether a recorded fault
has recovered (:func:`recovery_wait`), and the Ready/Progressing (:func:`readiness`) and Degraded
(:func:`degradation`) conditions.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from trtforge_operator.api import FaultRecord
from trtforge_operator.api.common import ConditionStatus
from trtforge_operator.observe.views import JobView
from trtforge_operator.planning import faults
from trtforge_operator.planning.text import one_line

# ------------------------------------------------------------------------------- a target's message


@dataclass(frozen=True)
class TargetRollout:
    """Where one served target stands: its engine (from the TRTEngine's status) and its Deployment."""

    engine_phase: str
    engine_detail: str  # the engine target's message, else its reason
    engine_key: str | None
    rollout_stuck: bool  # the Deployment passed its progress deadline
    rolled_out: bool  # the Deployment is up to date and rolled out, with no pod on an avoided node


def engine_not_ready(t: TargetRollout) -> str | None:
    """The target's engine is not Ready: its Deployment waits (the previous one keeps serving)."""
    if t.engine_phase == "Ready":
        return None
    return f"engine {t.engine_phase.lower()}: {t.engine_detail}".strip()


def rollout_stuck(t: TargetRollout) -> str | None:
    """New pods do not become ready within the progress deadline."""
    return (
        "rollout stuck: new pods are not becoming ready (the previous engine keeps serving)"
        if t.rollout_stuck
        else None
    )


def rolling_out(t: TargetRollout) -> str | None:
    """The Deployment is being made, replaced or rolled out."""
    return None if t.rolled_out else f"rolling out engine {t.engine_key[:12] if t.engine_key else ''}"


TARGET_MESSAGES = (engine_not_ready, rollout_stuck, rolling_out)


def target_message(t: TargetRollout) -> str:
    """The first answer of :data:`TARGET_MESSAGES`; "serving" when every policy passes."""
    for policy in TARGET_MESSAGES:
        message = policy(t)
        if message is not None:
            return message
    return "serving"


# ----------------------------------------------------------------------------- a fault's recovery


class RecoveryWait(enum.StrEnum):
    """Why a recorded fault has not recovered yet."""

    RECORDED = "recorded"  # its recovery is recorded already
    ROLLOUT = "rollout"  # its target is not rolled out (off the faulty node) yet
    REBUILD = "rebuild"  # the rebuild it asked for has not finished
    NEW_ENGINE = "new-engine"  # the rebuilt engine does not serve yet


@dataclass(frozen=True)
class FaultRecovery:
    """What a recorded fault's recovery looks at."""

    record: FaultRecord
    rolled_out: bool  # its target's rollout is done
    rebuild: JobView | None  # the rebuild Job its target still asks for, if any
    served_sha256: str | None  # the engine digest its target's Deployment serves


def recorded_already(f: FaultRecovery) -> RecoveryWait | None:
    return RecoveryWait.RECORDED if f.record.recovered_seconds is not None else None


def target_not_rolled_out(f: FaultRecovery) -> RecoveryWait | None:
    return None if f.rolled_out else RecoveryWait.ROLLOUT


def rebuild_not_finished(f: FaultRecovery) -> RecoveryWait | None:
    """A fault that asked for a rebuild waits for its Job (one still running, or none yet)."""
    if f.record.action not in faults.REBUILD_ACTIONS:
        return None
    return RecoveryWait.REBUILD if f.rebuild is None or f.rebuild.running else None


def rebuilt_engine_not_served(f: FaultRecovery) -> RecoveryWait | None:
    """A rebuild that made an engine waits until the target's Deployment serves it."""
    job = f.rebuild
    if f.record.action not in faults.REBUILD_ACTIONS or job is None or not job.complete:
        return None
    sha = (job.result() or {}).get("sha256")
    return RecoveryWait.NEW_ENGINE if sha and f.served_sha256 != sha else None


RECOVERY_POLICIES = (recorded_already, target_not_rolled_out, rebuild_not_finished, rebuilt_engine_not_served)


def recovery_wait(f: FaultRecovery) -> RecoveryWait | None:
    """Why the fault has not recovered; None: it recovers now."""
    for policy in RECOVERY_POLICIES:
        wait = policy(f)
        if wait is not None:
            return wait
    return None


# ------------------------------------------------------------------------------------- conditions


@dataclass(frozen=True)
class Serving:
    """What the Ready and Progressing conditions look at."""

    engine_found: bool
    engine_problem: str  # why the engine is missing
    engine_has_targets: bool
    replicas: int  # replicas wanted over all served targets
    targets: int  # served targets
    not_done: Sequence[tuple[str, str]] = ()  # (target, message) of those not rolled out
    waiting_for_engine: bool = False  # one of those waits for its engine


@dataclass(frozen=True)
class Readiness:
    """The Ready and Progressing conditions: status, reason and message of each."""

    ready: ConditionStatus
    ready_reason: str
    progressing: ConditionStatus
    progressing_reason: str
    message: str
    progressing_message: str | None = None  # None: the same message


def engine_missing(s: Serving) -> Readiness | None:
    if s.engine_found:
        return None
    return Readiness("False", "EngineNotFound", "False", "WaitingForEngine", s.engine_problem)


def no_targets(s: Serving) -> Readiness | None:
    if s.targets:
        return None
    msg = "no engine target matches spec.targets" if s.engine_has_targets else "the engine has no targets yet"
    return Readiness("False", "NoTargets", "False", "WaitingForEngine", msg)


def rollout_pending(s: Serving) -> Readiness | None:
    if not s.not_done:
        return None
    msg = one_line("; ".join(f"{name}: {message}" for name, message in s.not_done), 1000)
    if s.waiting_for_engine:
        return Readiness("False", "EngineNotReady", "True", "WaitingForEngine", msg)
    return Readiness("False", "RolloutInProgress", "True", "RollingOut", msg)


def all_replicas_ready(s: Serving) -> Readiness:
    msg = f"{s.replicas}/{s.replicas} replicas ready on {s.targets} target(s)"
    return Readiness("True", "AllReplicasReady", "False", "RolloutComplete", msg, progressing_message="")


READINESS_POLICIES = (engine_missing, no_targets, rollout_pending)


def readiness(s: Serving) -> Readiness:
    for policy in READINESS_POLICIES:
        answer = policy(s)
        if answer is not None:
            return answer
    return all_replicas_ready(s)


@dataclass(frozen=True)
class Health:
    """What the Degraded condition looks at."""

    open_faults: Sequence[FaultRecord]  # recorded faults not recovered yet, oldest first
    stuck: Sequence[str]  # Deployments past their progress deadline


@dataclass(frozen=True)
class Degradation:
    status: ConditionStatus
    reason: str
    message: str


def gpu_fault_open(h: Health) -> Degradation | None:
    if not h.open_faults:
        return None
    r = h.open_faults[-1]
    what = f"Xid {r.xid}" if r.xid is not None else (r.reason or "fault")
    msg = f"{len(h.open_faults)} fault(s) being handled; last: {what} on {r.node} ({r.action})"
    return Degradation("True", "GPUFault", one_line(msg, 1000))


def rollouts_stuck(h: Health) -> Degradation | None:
    if not h.stuck:
        return None
    return Degradation(
        "True",
        "RolloutStuck",
        f"rollout of {', '.join(sorted(h.stuck))} passed its progress deadline; the previous "
        "engine keeps serving",
    )


DEGRADED_POLICIES = (gpu_fault_open, rollouts_stuck)


def degradation(h: Health) -> Degradation:
    for policy in DEGRADED_POLICIES:
        answer = policy(h)
        if answer is not None:
            return answer
    return Degradation("False", "AsExpected", "")
