"""How a leader-elected operator runs: idle and ready until it holds the Lease, then act; exit when lost.

`run_while_leading(act)` waits for the Lease, then runs `act(stop)` (kopf, the GC loop) and renews the
Lease beside it. Three ways out:

- renewal fails for the renew deadline (or another replica holds the Lease): the process exits at
  once with ``LEASE_LOST_EXIT_CODE`` (client-go's OnStoppedLeading → exit). A watchdog *thread*
  enforces the deadline too, so a stuck event loop or a hung API call cannot keep a replica acting;
- SIGTERM / SIGINT: `act` stops, the Lease is released (a candidate takes over at once), exit 0;
- `act` ends by itself (kopf stopped on a signal): the Lease is released, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from trtforge.logs import fields
from trtforge_operator.config import LeaderElectionSettings
from trtforge_operator.leader.elector import Elector, LeadershipLost

log = logging.getLogger(__name__)

LEASE_LOST_EXIT_CODE = 3
WATCHDOG_TICK_S = 0.1

Act = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


IDENTITY_ENV = "TRTFORGE_LEADER_IDENTITY"


def replica_identity(env: dict[str, str] | None = None) -> str:
    """``$TRTFORGE_LEADER_IDENTITY`` when set (a process that should reclaim its own Lease at once
    after a restart, e.g. a local operator); else, as client-go does, the pod's name (or the host's)
    plus a random suffix: a restarted container is a new candidate, never mistaken for the old
    holder, so after a crash the standby that has been watching the Lease takes over."""
    env = dict(os.environ) if env is None else env
    fixed = env.get(IDENTITY_ENV, "").strip()
    if fixed:
        return fixed
    base = env.get("POD_NAME", "").strip() or socket.gethostname()
    return f"{base}_{uuid.uuid4().hex[:8]}"


def exit_now(reason: str) -> None:
    """Leave without running anything else: no handler, no pending API call, no finalizer."""
    log.error(
        "leadership lost; exiting",
        extra=fields(reason=reason, exit_code=LEASE_LOST_EXIT_CODE, at=round(time.time(), 3)),
    )
    for h in logging.getLogger().handlers:
        try:
            h.flush()
        except Exception:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(LEASE_LOST_EXIT_CODE)


class Watchdog(threading.Thread):
    """Ends the process when the elector's deadline passes, whatever the event loop is doing."""

    def __init__(self, elector: Elector, on_expired: Callable[[str], None] = exit_now) -> None:
        super().__init__(name="lease-watchdog", daemon=True)
        self.elector, self.on_expired = elector, on_expired
        self.disarmed = threading.Event()

    def run(self) -> None:
        while not self.disarmed.is_set():
            deadline = self.elector.deadline
            now = self.elector.clock()
            if deadline is not None and now >= deadline:
                self.on_expired("renew deadline passed (watchdog)")
                return
            wait = WATCHDOG_TICK_S if deadline is None else min(WATCHDOG_TICK_S, deadline - now)
            self.disarmed.wait(max(0.0, wait))


def _on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass


async def run_while_leading(
    elector: Elector,
    act: Act,
    on_leading: Callable[[bool], None] | None = None,
    stop: asyncio.Event | None = None,
    on_lost: Callable[[str], None] = exit_now,
) -> int:
    """Wait for the Lease, run `act` while holding it; the exit code for the process.

    `on_lost` ends the process (tests pass their own); it is called from the watchdog thread or the
    event loop, whichever notices first.
    """
    s: LeaderElectionSettings = elector.settings
    stop = stop or asyncio.Event()
    _on_signals(stop)
    notify = on_leading or (lambda _leading: None)
    notify(False)
    log.info(
        "waiting to lead",
        extra=fields(
            identity=elector.identity,
            lease=s.lease_name,
            lease_duration_s=s.lease_duration_seconds,
            renew_deadline_s=s.renew_deadline_seconds,
            retry_period_s=s.retry_period_seconds,
        ),
    )
    if not await elector.acquire(stop):
        return 0
    notify(True)
    log.info("leading", extra=fields(identity=elector.identity, at=round(time.time(), 3)))
    watchdog = Watchdog(elector, on_lost)
    watchdog.start()
    # Renewal starts before `act`: kopf treats every task created after it starts as its own and
    # cancels those when it stops.
    keep_stop = asyncio.Event()
    keeper = asyncio.create_task(elector.keep(keep_stop), name="lease-renewal")
    await asyncio.sleep(0)
    act_stop = asyncio.Event()
    actor = asyncio.create_task(act(act_stop), name="leader-act")
    stopper = asyncio.create_task(stop.wait(), name="stop-signal")
    done, _ = await asyncio.wait({keeper, actor, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if keeper in done:
        e = keeper.exception()
        on_lost(str(e) if isinstance(e, LeadershipLost) else f"renewal crashed: {e!r}")
        actor.cancel()  # only reached when on_lost returns (tests)
        stopper.cancel()
        return LEASE_LOST_EXIT_CODE
    # Stopping on purpose: keep renewing while `act` winds down, then release.
    code = 0
    act_stop.set()
    try:
        await actor
    except Exception:
        log.exception("the operator stopped with an error")
        code = 1
    stopper.cancel()
    keep_stop.set()
    keeper.cancel()
    watchdog.disarmed.set()
    await elector.release()
    notify(False)
    return code
