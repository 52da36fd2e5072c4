"""Which asyncio event loop ``trtforge serve`` runs on: the standard library's, or uvloop's.

``--event-loop asyncio`` (the default) or ``uvloop``. uvloop is an optional dependency
(``trtforge-runtime[uvloop]``); its effect on throughput with ``--workers`` on many cores is measured in
docs/benchmarks.md ("Many cores"), and the default follows that measurement (docs/design.md
§"Event loop").
"""

from __future__ import annotations

import importlib.util
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CHOICES = ("asyncio", "uvloop")
DEFAULT = "asyncio"


class EventLoopUnavailable(RuntimeError):
    """The chosen event loop cannot run here; the message says what to install."""


def check(name: str) -> None:
    """Raise EventLoopUnavailable when `name` (one of CHOICES) cannot run in this environment."""
    if name == "uvloop" and importlib.util.find_spec("uvloop") is None:
        raise EventLoopUnavailable(
            "--event-loop uvloop: the uvloop package is not installed; install "
            "'trtforge-runtime[uvloop]' or run with --event-loop asyncio"
        )


def run(main: Coroutine[Any, Any, T], name: str) -> T:
    """Run `main` to completion on a new event loop of kind `name` (checked by :func:`check`)."""
    if name == "uvloop":
        import uvloop

        return uvloop.run(main)
    import asyncio

    return asyncio.run(main)
