"""Start and stop the test bed's processes by pid.

Every process started here gets its own session (process group), a pid file under ``pids/``, a log
under ``logs/``, and the environment variable ``TRTFORGE_TESTBED_ROOT=<state root>`` so that ``down``
can also find descendants that outlived their parent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trtforge_dev.testbed.paths import MARKER_ENV, StatePaths


class PortInUseError(RuntimeError):
    pass


# Ports that free_ports hands out: below Linux's ephemeral range (32768-60999 by default), so no
# client's connect() picks one as its source port, and leased to the asking process in a file shared
# by every process on the machine, so two processes (pytest-xdist workers, concurrent pytest sessions)
# are never handed the same port while the first one lives.
PORT_RANGE = range(20000, 30000)  # and below the NodePort range, 30000-32767
_PORT_LEASES = "trtforge-port-leases.json"


@dataclass
class _PortLeases:
    next: int  # where the next search starts, so ports go round the range before one comes back
    held: dict[int, int]  # port -> pid of a live process it is leased to


def _runs(pid: int) -> bool:
    """Whether `pid` runs (not a zombie); unlike is_alive it never reaps a child of ours, whose
    Popen would then lose its exit code."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


@contextlib.contextmanager
def _port_leases() -> Iterator[_PortLeases]:
    """The live leases under an exclusive lock; what the block leaves in them is saved."""
    path = Path(tempfile.gettempdir()) / _PORT_LEASES
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError):
                saved = {}
            held = {int(k): int(v) for k, v in saved.get("held", {}).items()}
            leases = _PortLeases(
                next=int(saved.get("next", PORT_RANGE.start)),
                held={port: pid for port, pid in held.items() if _runs(pid)},
            )
            yield leases
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"next": leases.next, "held": leases.held}))
            tmp.replace(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1 that nothing listens on right now, from PORT_RANGE, leased
    to this process for its life: no other process that asks here gets them meanwhile. Each is checked
    by binding it, all of them at once."""
    picked: list[int] = []
    with _port_leases() as leases, contextlib.ExitStack() as stack:
        start = leases.next if leases.next in PORT_RANGE else PORT_RANGE.start
        for i in range(len(PORT_RANGE)):
            if len(picked) == n:
                break
            port = PORT_RANGE[(start - PORT_RANGE.start + i) % len(PORT_RANGE)]
            if port in leases.held:
                continue
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            picked.append(port)
        if len(picked) < n:
            raise PortInUseError(
                f"no {n} free ports left in {PORT_RANGE.start}-{PORT_RANGE.stop - 1} on 127.0.0.1: "
                f"stop the processes that hold them ({tempfile.gettempdir()}/{_PORT_LEASES} lists them)"
            )
        leases.held.update((port, os.getpid()) for port in picked)
        leases.next = picked[-1] + 1 if picked else start
    return picked


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
