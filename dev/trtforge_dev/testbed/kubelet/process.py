"""One container as a local process, in its own mount namespace with its volumes bind-mounted at
their real mountPaths (``unshare -m --propagation private``, then ``mount --bind``, then exec).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from trtforge_dev.testbed.kubelet.volumes import Mount


def mount_script(mounts: Sequence[Mount], keep_visible: Sequence[Path] = ()) -> str:
    """Shell that creates each mount point (inside the namespace, after its parents are mounted),
    bind-mounts the source there (read-only when asked) and finally execs the container's argv.

    Every source is opened before anything is mounted and bound through ``/proc/self/fd``, so a mount
    over one of its ancestors (an emptyDir at ``/tmp`` while the test bed lives under ``/tmp``) cannot
    hide it (``--no-canonicalize``: mount(8) would otherwise turn the fd back into a path, resolved
    after the earlier mounts). A real container brings its own root filesystem; ours shares the
    host's, so host paths it needs (`keep_visible`: the project, its Python, the test bed's state) are
    bound back at their own place when a mount shadows them.
    """
    targets = [Path(m.target) for m in mounts]
    shadowed = [k for k in keep_visible if any(k == t or t in k.parents for t in targets)]
    shadowed = [k for k in shadowed if not any(o != k and o in k.parents for o in shadowed)]
    lines = ["set -e"]
    fds = list(range(10, 10 + len(mounts) + len(shadowed)))
    sources = [m.source for m in mounts] + shadowed
    lines += [f"exec {fd}<{shlex.quote(str(src))}" for fd, src in zip(fds, sources, strict=True)]
    for fd, m in zip(fds, mounts, strict=False):
        dst = shlex.quote(m.target)
        if m.source.is_dir():
            lines.append(f"mkdir -p {dst}")
        else:
            lines.append(f'[ -e {dst} ] || {{ mkdir -p "$(dirname {dst})"; : > {dst}; }}')
        lines.append(f"mount --no-canonicalize --bind /proc/self/fd/{fd} {dst}")
        if m.read_only:
            lines.append(f"mount -o remount,bind,ro {dst}")
    for fd, k in zip(fds[len(mounts) :], shadowed, strict=True):
        lines.append(f"mkdir -p {shlex.quote(str(k))}")
        lines.append(f"mount --no-canonicalize --bind /proc/self/fd/{fd} {shlex.quote(str(k))}")
    if fds:
        lines.append("exec " + " ".join(f"{fd}<&-" for fd in fds))
    lines.append('exec "$@"')
    return "\n".join(lines)


def exit_code_of(returncode: int) -> int:
    """Popen's -N (killed by signal N) becomes 128+N, as a container runtime reports it."""
    return 128 - returncode if returncode < 0 else returncode


class ContainerProcess:
    """A started container; its pid leads its own process group."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        mounts: Sequence[Mount],
        log_path: Path,
        keep_visible: Sequence[Path] = (),
    ) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        self.started_at = time.time()
        with log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [
                    "unshare",
                    "-m",
                    "--propagation",
                    "private",
                    "--",
                    "bash",
                    "-c",
                    mount_script(mounts, keep_visible),
                    "bash",
                    *argv,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        """None while running, else the container exit code."""
        rc = self.proc.poll()
        return None if rc is None else exit_code_of(rc)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, grace_s: float) -> int:
        """SIGTERM the process group, SIGKILL after `grace_s`; returns the exit code."""
        if self.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=max(grace_s, 0.0))
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait()
        # Whatever the main process left in its group goes too.
        self.signal(signal.SIGKILL)
        rc = self.poll()
        return 137 if rc is None else rc
