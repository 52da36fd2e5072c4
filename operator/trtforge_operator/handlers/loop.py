"""The level-based loop, one per TRTEngine and InferenceDeployment: pass, then wait until woken,
stopped or the resync timer (workqueue.py wakes it)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from trtforge.logs import fields
from trtforge_operator.handlers.deployment import reconcile_deployment
from trtforge_operator.handlers.engine import reconcile_engine
from trtforge_operator.handlers.finished_jobs import INDICES as CLEANUP_INDICES
from trtforge_operator.kinds import Kind
from trtforge_operator.planning.text import one_line
from trtforge_operator.state import State
from trtforge_operator.workqueue import (
    jittered,
)

log = logging.getLogger(__name__)
DEBOUNCE_S = 0.2


async def loop(state: State, kind: Kind, body: Any, stopped: Any, kwargs: Mapping[str, Any]) -> None:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    trigger = state.queue.get(kind, ns, name)
    if state.indices is None:  # the same index objects every handler gets (finished-Job cleanup reads them)
        state.indices = {k: kwargs[k] for k in CLEANUP_INDICES}
    fn = reconcile_engine if kind == Kind.TRTENGINE else reconcile_deployment
    key = (kind, ns, name)
    resync = state.cfg.engine_resync_seconds if kind == Kind.TRTENGINE else state.cfg.resync_seconds
    while not stopped:
        trigger.clear()
        t0 = time.monotonic()
        wait = jittered(resync, random.random())
        state.watch.started(key)
        try:
            again = await fn(state, body, kwargs)
            state.metrics.reconciles.labels(kind, "ok").inc()
            if again:
                wait = min(wait, again)
        except (ApiException, OSError) as e:
            state.metrics.reconciles.labels(kind, "error").inc()
            log.warning(
                "%s %s/%s: reconcile failed, retrying: %s",
                kind,
                ns,
                name,
                one_line(str(e), 200),
                extra=fields(kind=kind, namespace=ns, name=name),
            )
            wait = min(wait, 5.0)
        except Exception:
            state.metrics.reconciles.labels(kind, "error").inc()
            log.exception("%s %s/%s: reconcile crashed", kind, ns, name)
            wait = min(wait, 10.0)
        finally:
            state.watch.finished(key, due_in=wait)
            state.metrics.reconcile_seconds.labels(kind).observe(time.monotonic() - t0)
        await wait_any(trigger, stopped, wait)
        await asyncio.sleep(DEBOUNCE_S)


async def wait_any(trigger: asyncio.Event, stopped: Any, timeout: float) -> None:
    """Until woken, stopped (deletion, shutdown: exit promptly) or the resync timeout."""

    async def _stopped() -> None:
        await stopped.wait()

    tasks = [asyncio.ensure_future(trigger.wait()), asyncio.ensure_future(_stopped())]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
