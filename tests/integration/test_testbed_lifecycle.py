"""`trtforge cluster up/down/status` as a user runs them, on a private state root (a second, short-lived
test bed beside the shared one): nodes Ready through kubectl, `up` twice, a port in use, and `down`
leaving no process behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from trtforge_dev.testbed import procs
from trtforge_dev.testbed.binaries import resolve
from trtforge_dev.testbed.paths import StatePaths
from trtforge_dev.testbed.wait import wait_for

pytestmark = pytest.mark.integration


def cluster(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trtforge.cli", "--log-format", "text", "cluster", "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_up_status_get_nodes_and_down_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    try:
        r = cluster(root, "up")
        assert r.returncode == 0, r.stderr
        pids = [
            procs.read_pid(StatePaths(root), c)
            for c in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
        ]
        assert all(p is not None and procs.is_alive(p) for p in pids)

        out = subprocess.run(
            [
                str(resolve().kubectl),
                f"--kubeconfig={root / 'kubeconfig'}",
                "get",
                "nodes",
                "-L",
                "nvidia.com/gpu.product",
                "--no-headers",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = {line.split()[0]: line.split() for line in out.splitlines()}
        assert {"gpu-h100-0", "gpu-h100-1", "gpu-gh200-0", "gpu-b200-mig-0", "cpu-0"} <= set(rows)
        assert all(row[1] == "Ready" for row in rows.values())
        assert rows["gpu-b200-mig-0"][-1] == "NVIDIA-B200"

        again = cluster(root, "up")
        assert again.returncode == 0 and "already up" in again.stdout

        st = cluster(root, "status")
        assert st.returncode == 0 and "state:  up" in st.stdout

        # The emulated kubelet is restartable: `up` brings back a dead one.
        kubelet = procs.read_pid(StatePaths(root), "kubelet")
        assert kubelet is not None
        os.kill(kubelet, signal.SIGKILL)
        wait_for(lambda: not procs.is_alive(kubelet), timeout=10, desc="kubelet to die")
        again = cluster(root, "up")
        assert again.returncode == 0 and "restarting it" in again.stderr
        restarted = procs.read_pid(StatePaths(root), "kubelet")
        assert restarted is not None and restarted != kubelet and procs.is_alive(restarted)
        pids.append(restarted)
    finally:
        down = cluster(root, "down")
    assert down.returncode == 0, down.stderr
    assert procs.marked_pids(root) == []
    assert not any(p is not None and procs.is_alive(p) for p in pids)
    st = cluster(root, "status")
    assert st.returncode == 3 and "state:  down" in st.stdout


def test_port_in_use_is_refused_clearly(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = cluster(tmp_path / "c", "up", "--port", str(port))
    assert r.returncode == 1
    assert f"port {port} on 127.0.0.1 (for kube-apiserver) is already in use" in r.stderr
    assert "Traceback" not in r.stderr
    assert procs.marked_pids(tmp_path / "c") == []
