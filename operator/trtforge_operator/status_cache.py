"""The status the operator last wrote per object, so a pass that holds an older body (kopf's daemon
body lags the write it just made) plans from what is really there and writes nothing twice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtforge_operator.kinds import Kind


def resource_version(meta: Mapping[str, Any]) -> int:
    try:
        return int(meta.get("resourceVersion") or 0)
    except ValueError:
        return 0


class StatusCache:
    def __init__(self) -> None:
        self._written: dict[tuple[Kind, str, str], tuple[int, dict[str, Any]]] = {}

    def current(self, kind: Kind, body: Mapping[str, Any]) -> dict[str, Any]:
        """The object's status, or what we wrote last when the body we hold is older than that write."""
        meta = body.get("metadata") or {}
        hit = self._written.get((kind, meta.get("namespace", ""), meta.get("name", "")))
        if hit is not None and hit[0] > resource_version(meta):
            return hit[1]
        return dict(body.get("status") or {})

    def wrote(self, kind: Kind, namespace: str, name: str, rv: int, status: dict[str, Any]) -> None:
        self._written[(kind, namespace, name)] = (rv, status)

    def echoes(self, kind: Kind, body: Mapping[str, Any]) -> bool:
        """Whether `body` is exactly the version our last status write made (its watch echo: nothing
        in it is news to the loop that wrote it)."""
        meta = body.get("metadata") or {}
        hit = self._written.get((kind, meta.get("namespace", ""), meta.get("name", "")))
        return hit is not None and hit[0] == resource_version(meta) != 0

    def forget(self, kind: Kind, namespace: str, name: str) -> None:
        self._written.pop((kind, namespace, name), None)
