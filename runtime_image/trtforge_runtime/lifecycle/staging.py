"""Where a downloaded engine file is verified before the backend loads it: in memory or on disk.

On disk (the cache file itself, renamed into place once its sha256 matches), the start waits for the
node's disk: every byte is written before the load begins, and a node whose disk is slow or whose
dirty pages are throttled makes that write the longest step of a cold start (100 MB took 0.03 s or
0.3 s on the same test machine, depending on its dirty pages). In memory, the file streams into a
sealed memfd (``memfd_create``; once verified nothing can change, grow or shrink it), the backend
loads ``/proc/self/fd/<n>`` at once, and a background thread copies it to the cache file for the
next container restart; when that copy is in place, descriptor ``<n>`` is pointed at the cache file
(``dup2``), which gives the memory back while the path stays valid for later loads (the solo
session opens it again).

The choice (:func:`staging_for`, pure) is memory only when this process is the pod's only worker
(with ``--workers``, the workers after the first start from the cache file the first one wrote), the
file's size is known, and it is at most a quarter of the memory budget: the pod's memory limit, or
the node's available memory, whichever is smaller (docs/design.md, "Runtime cold start").
"""

from __future__ import annotations

import enum
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from trtforge.logs import fields
from trtforge_runtime.lifecycle.workers import WORKERS_ENV  # imported by the CLI before anything else

log = logging.getLogger(__name__)

MEMORY_SHARE = 4  # a file staged in memory is at most 1/MEMORY_SHARE of the memory budget
CGROUP_V2_MAX = Path("/sys/fs/cgroup/memory.max")
CGROUP_V1_LIMIT = Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")
MEMINFO = Path("/proc/meminfo")
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


class Staging(enum.Enum):
    MEMORY = "memory"  # a sealed memfd; the cache copy is written after, off the start's path
    DISK = "disk"  # the cache file itself, written and renamed before the load


def staging_for(size: int | None, workers: int, budget: int | None) -> Staging:
    """Where to verify a downloaded file of `size` bytes (None: unknown) in a pod of `workers`
    worker processes with `budget` bytes of memory (None: unknown)."""
    if workers != 1 or size is None or budget is None:
        return Staging.DISK
    return Staging.MEMORY if size * MEMORY_SHARE <= budget else Staging.DISK


def parse_limit(text: str) -> int | None:
    """A cgroup memory limit file's value; None for no limit ("max", or v1's huge sentinel)."""
    value = text.strip()
    if not value or value == "max":
        return None
    limit = int(value)
    return None if limit >= 1 << 62 else limit


def parse_available(meminfo: str) -> int | None:
    """MemAvailable from /proc/meminfo's text, in bytes."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def memory_budget() -> int | None:
    """The smaller of this cgroup's memory limit and the node's available memory; None when
    neither can be read."""
    known: list[int] = []
    for path in (CGROUP_V2_MAX, CGROUP_V1_LIMIT):
        try:
            limit = parse_limit(path.read_text())
        except (OSError, ValueError):
            continue
        if limit is not None:
            known.append(limit)
        break
    try:
        available = parse_available(MEMINFO.read_text())
    except (OSError, ValueError):
        available = None
    if available is not None:
        known.append(available)
    return min(known) if known else None


def choose(size: int | None) -> Staging:
    """:func:`staging_for` with this process's facts (DISK where memfds cannot be sealed)."""
    if not hasattr(os, "memfd_create"):
        return Staging.DISK
    try:
        workers = int(os.environ.get(WORKERS_ENV, "1"))
    except ValueError:
        workers = 0  # unreadable: the safe choice
    return staging_for(size, workers, memory_budget() if size is not None else None)


def part_name(file: str, pid: int) -> str:
    """The temporary name process `pid` writes a cache copy of `file` under before its rename."""
    return f".{file}.{pid}.part"


def open_memfd(name: str) -> int:
    """A new anonymous file that can be sealed (closed on exec)."""
    return os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def seal(fd: int) -> None:
    """From now on the file's bytes cannot change: no write, no growing, no shrinking."""
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)


def copy_to_cache(fd: int, size: int, dst: Path, commit: Callable[[Path], None]) -> Future[Path]:
    """On a thread: copy the sealed memfd `fd` to `dst` (a temporary name, then an atomic rename),
    call `commit(dst)` (the cache marker), then point `fd` at the cache file. The future has `dst`;
    on failure, its exception, and `fd` keeps the memory copy (serving goes on; the next restart
    downloads again)."""
    done: Future[Path] = Future()

    def work() -> None:
        tmp = dst.with_name(part_name(dst.name, os.getpid()))
        try:
            with open(tmp, "wb") as out:
                offset = 0
                while offset < size:
                    sent = os.sendfile(out.fileno(), fd, offset, size - offset)
                    if sent == 0:
                        raise OSError(f"the copy of {dst.name} ended at {offset} of {size} bytes")
                    offset += sent
            os.replace(tmp, dst)
            commit(dst)
            cached = os.open(dst, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.dup2(cached, fd, inheritable=False)  # the memfd's memory is given back
            finally:
                os.close(cached)
        except BaseException as e:
            tmp.unlink(missing_ok=True)
            log.warning(
                "could not write the engine's cache copy; it stays in memory, and a container "
                "restart will download it again",
                extra=fields(path=str(dst), error=f"{type(e).__name__}: {e}"),
            )
            done.set_exception(e)
            return
        log.info("cache copy written", extra=fields(path=str(dst), bytes=size))
        done.set_result(dst)

    threading.Thread(target=work, name="cache-write", daemon=True).start()
    return done
