"""`kill_and_wait` returns once the process has exited, and leaves the reaping to its parent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trtforge_runtime.llm.kill import kill_and_wait


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split()[0]


def test_the_process_has_exited_when_it_returns_and_is_left_for_its_parent_to_reap() -> None:
    # A child that ignores SIGTERM: only the SIGKILL ends it.
    p = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(15, 1); time.sleep(600)"])
    try:
        assert kill_and_wait(p.pid)
        assert _state(p.pid) == "Z"  # exited, not yet reaped: its parent's wait still gets the status
        assert p.wait() == -9
    finally:
        p.kill()
        p.wait()


def test_a_process_already_gone_counts_as_exited() -> None:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert kill_and_wait(p.pid)
