"""Progress and timing in the logs: long copies report every few seconds, steps report their time."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

from trtforge.logs import fields
from trtforge_builder.errors import BuildError

log = logging.getLogger("trtforge_builder")


class Progress:
    """Call `update(n)` as bytes arrive; logs at most every `every_s` seconds, and once at the end."""

    def __init__(self, what: str, total: int | None = None, every_s: float = 2.0) -> None:
        self.what, self.total, self.every_s = what, total, every_s
        self.done = 0
        self.start = self._last = time.monotonic()

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._log("progress")

    def finish(self) -> None:
        self._log("done")

    def _log(self, state: str) -> None:
        secs = max(time.monotonic() - self.start, 1e-9)
        kv: dict[str, object] = {
            "bytes": self.done,
            "MiB_per_s": round(self.done / secs / 2**20, 1),
            "seconds": round(secs, 2),
        }
        if self.total:
            kv["percent"] = round(100 * self.done / self.total, 1)
        log.info(f"{self.what}: {state}", extra=fields(**kv))


class Steps:
    """The pipeline's steps: each is logged with its time; the current one names a failure or timeout."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        self.current = name
        start = time.monotonic()
        log.info(f"step {name}: started", extra=fields(step=name))
        try:
            yield
        except BuildError as e:
            if e.step is None:
                e.step = name
            raise
        finally:
            secs = time.monotonic() - start
            self.seconds[name] = round(secs, 3)
        log.info(f"step {name}: done", extra=fields(step=name, seconds=round(secs, 3)))
