"""`TestBed`: a running test bed as tests and scripts use it, and `acquire`/`release` for sharing one
between concurrent pytest sessions (the last pytest session out stops a test bed that one of them started).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from trtforge.contract.gpu_probe import GPUDevice
from trtforge_dev.testbed import controlplane, faults, procs
from trtforge_dev.testbed.binaries import resolve
from trtforge_dev.testbed.paths import StatePaths
from trtforge_dev.testbed.podlogs import read_pod_log
from trtforge_dev.testbed.profile import MigSpec


class TestBed:
    """A test bed that is up. Every method talks to it with its admin kubeconfig."""

    __test__ = False  # not a pytest test class

    def __init__(self, paths: StatePaths) -> None:
        self.paths = paths
        st = controlplane.ClusterState.load(paths)
        if st is None:
            raise controlplane.ClusterError(f"the test bed at {paths.root} is not up")
        self.state = st
        self.kubectl_path = Path(st.binaries.get("kubectl") or resolve().kubectl)

    @property
    def root(self) -> Path:
        return self.paths.root

    @property
    def kubeconfig(self) -> Path:
        return self.paths.kubeconfig

    @property
    def server(self) -> str:
        return self.state.server

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the test bed's kubectl (1.20) with its kubeconfig; text in and out."""
        cmd = [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", *args]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise subprocess.CalledProcessError(r.returncode, cmd, r.stdout, r.stderr)
        return r

    def api_client(self) -> client.ApiClient:
        """A new ApiClient (admin); close it when done (`with tb.api_client() as api:`)."""
        from trtforge_dev.testbed.kube import api_client

        return api_client(self.kubeconfig)

    def gpu_file(self, node: str) -> Path:
        """The node's emulated GPU file (what TRTFORGE_GPU_PROBE=emulated:<file> points at)."""
        return self.paths.gpu_file(node)

    def fault(self, node: str, gpu: int | None = None, xid: int = 79) -> GPUDevice:
        return faults.fault(self.paths, node, gpu=gpu, xid=xid)

    def heal(self, node: str) -> None:
        faults.heal(self.paths, node)

    def set_mig(self, node: str, mig: MigSpec | None) -> None:
        """Reconfigure `node`'s MIG as the GPU Operator's MIG manager would (None: the profile's own)."""
        faults.set_mig(self.paths, node, mig)

    def node_down(self, node: str) -> None:
        faults.node_down(self.paths, node)

    def node_up(self, node: str) -> None:
        faults.node_up(self.paths, node)

    def kill_apiserver(self) -> int:
        """SIGKILL the kube-apiserver (a crash); `start_apiserver` brings it back."""
        return controlplane.kill_apiserver(self.paths)

    def start_apiserver(self, timeout_s: float = 60.0) -> int:
        return controlplane.start_apiserver(self.paths, timeout_s)

    def pod_log(self, namespace: str, pod: str, container: str | None = None, previous: bool = False) -> str:
        return read_pod_log(self.paths, namespace, pod, container, previous=previous)


# --- sharing between sessions -----------------------------------------------------------------------
def _users(paths: StatePaths) -> Path:
    return paths.root / "users"


@contextlib.contextmanager
def _lock(paths: StatePaths) -> Iterator[None]:
    paths.root.mkdir(parents=True, exist_ok=True)
    with (paths.root / ".lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _owner_file(paths: StatePaths) -> Path:
    return paths.root / "started-by-session.json"


def acquire(paths: StatePaths, **up_kwargs: Any) -> TestBed:
    """Use the test bed at `paths` if it is up, else start it (as this pytest session's); register this
    process."""
    with _lock(paths):
        if not controlplane.is_up(paths):
            controlplane.up(paths, **up_kwargs)
            _owner_file(paths).write_text(json.dumps({"pid": os.getpid()}))
        users = _users(paths)
        users.mkdir(parents=True, exist_ok=True)
        (users / str(os.getpid())).write_text("")
        return TestBed(paths)


def release(paths: StatePaths) -> bool:
    """Unregister this process; stop the test bed if a pytest session started it and no live one uses it.
    Returns True if it was stopped."""
    with _lock(paths):
        users = _users(paths)
        (users / str(os.getpid())).unlink(missing_ok=True)
        live = (
            [u for u in users.glob("*") if u.name.isdigit() and procs.is_alive(int(u.name))]
            if users.is_dir()
            else []
        )
        if live or not _owner_file(paths).is_file():
            return False
        controlplane.down(paths)
        _owner_file(paths).unlink(missing_ok=True)
        return True
