"""What the operator process keeps between passes: its clients, counters, wake-ups and caches."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from trtforge_operator.autoscaling_discovery import AutoscalingDiscovery
from trtforge_operator.build_slots import BuildSlots
from trtforge_operator.config import OperatorConfig
from trtforge_operator.kinds import Kind
from trtforge_operator.kube import Kube
from trtforge_operator.metrics import Metrics
from trtforge_operator.observe.claim_view import StoreClaimView
from trtforge_operator.observe.views import NodeView
from trtforge_operator.status_cache import StatusCache
from trtforge_operator.store_reader import StoreReader
from trtforge_operator.workqueue import LoopWatch, WorkQueue

log = logging.getLogger(__name__)
V = TypeVar("V")
M = TypeVar("M", bound=BaseModel)


@dataclasses.dataclass
class State:
    cfg: OperatorConfig
    kube: Kube
    store: StoreReader
    metrics: Metrics
    queue: WorkQueue = dataclasses.field(default_factory=WorkQueue)
    watch: LoopWatch = dataclasses.field(default_factory=lambda: LoopWatch(stuck_after=300.0))
    slots: BuildSlots = dataclasses.field(init=False)
    statuses: StatusCache = dataclasses.field(default_factory=StatusCache)
    indices: Mapping[str, Any] | None = None  # kopf's indices, once a handler has been given them
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)  # background loops
    node_views: list[NodeView] | None = None  # the Nodes index as a list; None after any Node event
    discovery: AutoscalingDiscovery = dataclasses.field(init=False)  # the served autoscaling APIs
    # Build Jobs whose pod's result this process copied onto them, until the Job's own event shows
    # it (a pass before that event writes it no second time).
    results_recorded: set[str] = dataclasses.field(default_factory=set)
    # The store's claim as last read (handlers/store_claim.py); None: no claim, or not read yet.
    store_claim: StoreClaimView | None = None

    def nodes(self, indices: Mapping[str, Any]) -> list[NodeView]:
        """Every Node's view, read from the index once per Node event (not once per pass)."""
        if self.node_views is None:
            self.node_views = views(indices["nodes_idx"], NodeView)
        return self.node_views

    def __post_init__(self) -> None:
        self.discovery = AutoscalingDiscovery(self.kube, self.cfg.autoscaling)
        self.slots = BuildSlots(
            self.cfg.build.max_concurrent,
            self.cfg.build.max_concurrent_per_namespace,
            self.cfg.build_namespace,
        )


def plain(body: Any) -> dict[str, Any]:
    return json.loads(json.dumps(dict(body), default=str))


def views(index: Any, cls: type[V]) -> list[V]:
    """A snapshot of every `cls` value of a kopf index (it changes under us between awaits)."""
    return [v for store in list(index.values()) for v in list(store) if isinstance(v, cls)]


def parsed_status(cls: type[M], raw: Mapping[str, Any]) -> M:
    """A status as its model, or an empty one when what is there does not validate."""
    try:
        return cls.model_validate(raw or {})
    except ValidationError:
        return cls()


def forget(state: State, kind: Kind, namespace: str, name: str) -> None:
    """Drop what the operator keeps about a deleted object (its wake-up flag, the status it wrote)."""
    state.queue.drop(kind, namespace, name)
    state.watch.forget((kind, namespace, name))
    state.statuses.forget(kind, namespace, name)
    state.metrics.forget(kind, namespace, name)
