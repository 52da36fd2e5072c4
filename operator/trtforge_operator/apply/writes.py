"""The writes both appliers share: a resource's status, patched only when it differs from what is
there (status_cache.py), and the Events posted on it (docs/design.md §"One writer per child")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from trtforge_operator.kinds import Kind
from trtforge_operator.kube import Kube, clean_status, status_patch
from trtforge_operator.planning.events import Event
from trtforge_operator.state import State
from trtforge_operator.status_cache import resource_version


async def write_status(
    state: State,
    kind: Kind,
    plural: str,
    body: Mapping[str, Any],
    old: Mapping[str, Any],
    new: dict[str, Any],
) -> bool:
    """Patch the status from `old` to `new` when they differ; whether it wrote."""
    patch = status_patch(old, new)
    if patch is None:
        return False
    meta = body["metadata"]
    res = await state.kube.patch_status(plural, meta["namespace"], meta["name"], patch)
    rv = resource_version((res or {}).get("metadata") or {})
    state.statuses.wrote(kind, meta["namespace"], meta["name"], rv, clean_status(new))
    state.metrics.status_writes.labels(kind).inc()
    return True


async def post_events(state: State, body: Mapping[str, Any], events: Iterable[Event]) -> None:
    for ev in events:
        await post_event(state.kube, body, ev)


async def post_event(kube: Kube, body: Mapping[str, Any], ev: Event) -> None:
    """Post one Event on `body`: every Event the operator writes goes through here."""
    await kube.event(body, ev.type, ev.reason, ev.message)
