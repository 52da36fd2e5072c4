"""Events the planners ask the handlers to post (what `kubectl describe` shows)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


def merged(events: Sequence[Event], limit: int = 1024) -> list[Event]:
    """One Event per type and reason, their messages joined in order (a pass that finds three
    targets Ready posts one EngineReady naming all three, not three Events)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for e in events:
        groups.setdefault((e.type, e.reason), []).append(e.message)
    out = []
    for (type_, reason), messages in groups.items():
        text = "; ".join(messages)
        out.append(Event(type_, reason, text if len(text) <= limit else text[: limit - 1] + "…"))
    return out
