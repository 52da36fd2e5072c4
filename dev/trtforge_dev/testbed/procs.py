"""Start and stop the test bed's processes by pid.

Every process started here gets its own session (process group), a pid file under ``pids/``, a log
under ``logs/``, and the environment variable ``TRTFORGE_TESTBED_ROOT=<state root>`` so that ``down``
can also find descendants that outlived their parent.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from trtforge_dev.testbed.paths import MARKER_ENV, StatePaths


class PortInUseError(RuntimeError):
    pass


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1 that nothing listens on right now. They are bound all at
    once: picked one at a time, the kernel may hand a port it just freed out again, and a process
    given the same port twice fails on its second bind."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (several for one process:
    :func:`free_ports`)."""
    return free_ports(1)[0]


def check_port_free(port: int, what: str) -> None:
    """Raise :class:`PortInUseError` naming `what` and what to do if 127.0.0.1:`port` is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"port {port} on 127.0.0.1 (for {what}) is already in use: stop whatever listens "
                    f"there (`ss -ltnp 'sport = :{port}'` shows it) or choose another port"
                ) from e
            raise


def is_alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie (reaps it when it is our own exited child)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def spawn(
    paths: StatePaths,
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Start `argv` in its own session, logging to ``logs/<name>.log``; returns and records its pid."""
    paths.logs.mkdir(parents=True, exist_ok=True)
    paths.pids.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ if env is None else env)
    full_env[MARKER_ENV] = str(paths.root)
    with paths.log(name).open("ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )
    paths.pid_file(name).write_text(str(proc.pid))
    return proc.pid


def read_pid(paths: StatePaths, name: str) -> int | None:
    try:
        return int(paths.pid_file(name).read_text().strip())
    except (OSError, ValueError):
        return None


def _belongs(pid: int, root: Path) -> bool:
    """The process carries our marker for this root (so a recycled pid is never killed)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER_ENV}={root}".encode() in env.split(b"\0")


def stop(pid: int, root: Path, grace_s: float = 10.0) -> None:
    """SIGTERM the process group of `pid`, then SIGKILL what is left after `grace_s`."""
    if not is_alive(pid) or not _belongs(pid, root):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and is_alive(pid):
        time.sleep(0.05)
    if is_alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and is_alive(pid):
            time.sleep(0.05)


def marked_pids(root: Path) -> list[int]:
    """Every live process carrying this root's marker."""
    out = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != me and _belongs(int(d.name), root) and is_alive(int(d.name)):
            out.append(int(d.name))
    return sorted(out)


def sweep(root: Path) -> list[int]:
    """SIGKILL every remaining process marked with `root`; returns the pids it killed."""
    killed = []
    for pid in marked_pids(root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(is_alive(p) for p in killed):
        time.sleep(0.05)
    return killed
