"""One build of the control-plane binaries per machine at a time (`trtforge cluster install`).

Two installs at once (two clones, or a helper beside `make test`) share the binary cache and its
build folder: one would delete the tree the other is compiling. So the build runs under an exclusive
`flock` on a file in the cache folder. A second install waits for the first (and says so), then
checks the cache again and reuses what the first built. The kernel drops the lock when its holder
exits, killed or not, so a crashed build never leaves the cache locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from trtforge.logs import fields

log = logging.getLogger(__name__)

LOCK_NAME = "install.lock"


@contextlib.contextmanager
def held(path: Path, what: str) -> Iterator[None]:
    """An exclusive flock on `path` for the block; when another process holds it, log that this one
    waits (naming the holder's pid, as it wrote it into the file) and wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            log.info(
                f"waiting for another process (pid {holder}) to finish {what}",
                extra=fields(lock=str(path), holder=holder),
            )
            fcntl.flock(f, fcntl.LOCK_EX)
            log.info(f"the other process finished {what}; going on", extra=fields(lock=str(path)))
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_once(lock: Path, missing: Callable[[], list[str]], build: Callable[[], object], what: str) -> bool:
    """Under the lock: `build()` when `missing()` names anything missing or broken, else reuse what
    is there (another process may have built it while this one waited). True when this call built."""
    with held(lock, what):
        problems = missing()
        if not problems:
            log.info(f"reusing the cached result of {what}", extra=fields(lock=str(lock)))
            return False
        log.info(f"{what}: {'; '.join(problems)}", extra=fields(lock=str(lock)))
        build()
        return True
