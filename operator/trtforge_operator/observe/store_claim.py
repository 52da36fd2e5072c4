"""Observe: the engine store's claim (a ``pvc://`` store), read by name in the build namespace with
its latest Event, into a typed view (observe/claim_view.py; docs/design.md §"Store claim that cannot
bind"). Only this claim is read: one GET and one Event list filtered to it, never a list of claims."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.rest import ApiException

from trtforge_operator.config import OperatorConfig
from trtforge_operator.kube import Kube
from trtforge_operator.observe.claim_view import ClaimPhase, StoreClaimView, store_claim_name

log = logging.getLogger(__name__)


async def observe_store_claim(kube: Kube, cfg: OperatorConfig) -> StoreClaimView | None:
    """The store's claim (build Jobs mount it in the build namespace); None for a store on no claim.
    Raises what the apiserver raises when it cannot answer (the caller keeps its last view)."""
    name = store_claim_name(cfg.store_uri)
    if name is None:
        return None
    ns = cfg.build_namespace
    pvc = await kube.read_claim(ns, name)
    events: list[dict[str, Any]] = []
    if pvc is None or (pvc.get("status") or {}).get("phase") != ClaimPhase.BOUND:
        try:
            events = await kube.claim_events(ns, name)
        except ApiException as e:  # the claim's own state still says enough
            log.warning("cannot list the Events of the store claim %s/%s: %s", ns, name, e.reason)
    return StoreClaimView.from_k8s(ns, name, pvc, events)
