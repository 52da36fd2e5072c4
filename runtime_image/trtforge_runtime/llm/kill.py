"""Kill a server process and wait until it has exited, without reaping it (asyncio's child watcher
still does). After a GPU fault the pod reports only once the server no longer holds the GPU."""

from __future__ import annotations

import contextlib
import os
import select
import signal

EXIT_WAIT_S = 10.0


def kill_and_wait(pid: int, wait_s: float = EXIT_WAIT_S) -> bool:
    """SIGKILL `pid` through a pidfd (no pid-reuse race) and wait up to `wait_s` for it to exit (a
    zombie counts: it holds no memory). True once it has exited or was already gone."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        poller = select.poll()
        poller.register(fd, select.POLLIN)  # readable once the process has exited
        return bool(poller.poll(int(wait_s * 1000)))
    finally:
        os.close(fd)
