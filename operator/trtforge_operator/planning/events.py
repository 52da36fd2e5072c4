"""Events the planners ask the handlers to post (what `kubectl describe` shows)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str
