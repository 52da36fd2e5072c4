"""Keeps the store's claim in view (observe/store_claim.py): read at start, then every few seconds
while it is not bound and every minute once it is; a change wakes every TRTEngine, whose pass
says why in StoreReady (docs/design.md §"Store claim that cannot bind")."""

from __future__ import annotations

import asyncio
import logging

import urllib3
from kubernetes.client.rest import ApiException

from trtforge.logs import fields
from trtforge_operator.kinds import Kind
from trtforge_operator.observe.store_claim import observe_store_claim
from trtforge_operator.state import State

log = logging.getLogger(__name__)
UNBOUND_INTERVAL_S = 5.0  # a claim that is not bound yet is looked at this often ...
BOUND_INTERVAL_S = 60.0  # ... and a bound one this often (a claim is Lost only with its volume)
UNAVAILABLE = (ApiException, OSError, urllib3.exceptions.HTTPError)  # forbidden, down, partitioned


async def refresh_store_claim(state: State) -> None:
    """Read the claim; when it changed, keep the new view and wake every TRTEngine. An apiserver
    that cannot answer leaves the last view as it was."""
    try:
        view = await observe_store_claim(state.kube, state.cfg)
    except UNAVAILABLE as e:
        log.warning("cannot read the store's claim; keeping the last view", extra=fields(error=str(e)))
        return
    if view == state.store_claim:
        return
    state.store_claim = view
    if view is not None:
        log.info(
            "store claim %s/%s is %s",
            view.namespace,
            view.name,
            view.phase,
            extra=fields(claim=view.name, phase=str(view.phase), event=view.event_reason or ""),
        )
    state.queue.fire_every(Kind.TRTENGINE)


async def run(state: State) -> None:
    """Until cancelled: look at the claim again, sooner while it is not bound."""
    while True:
        claim = state.store_claim
        await asyncio.sleep(BOUND_INTERVAL_S if claim is None or claim.bound else UNBOUND_INTERVAL_S)
        await refresh_store_claim(state)
