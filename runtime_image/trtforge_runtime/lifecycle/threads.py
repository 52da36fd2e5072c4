"""Work on a daemon thread of its own, its outcome in a future (standard library only, so the
start-up modules that run before the heavy imports can use it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


def on_thread(work: Callable[[], T], name: str) -> tuple[Future[T], threading.Thread]:
    """Start `work` on a daemon thread named `name`; the future gets what it returns or raises
    (any exception, as raised, for the caller to report), and the thread is returned started."""
    out: Future[T] = Future()

    def run() -> None:
        try:
            out.set_result(work())
        except BaseException as e:
            out.set_exception(e)

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return out, t
