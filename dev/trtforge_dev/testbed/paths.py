"""Where the test bed keeps things: its state under ``.cluster/`` and the binary cache.

The state root is ``$TRTFORGE_CLUSTER_DIR`` when set, else ``.cluster`` beside the project's
``pyproject.toml`` (the checkout trtforge is installed from), else ``./.cluster``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ROOT_ENV = "TRTFORGE_CLUSTER_DIR"
CACHE_ENV = "TRTFORGE_CACHE_DIR"
# Every process the test bed starts carries this variable (value: the state root); `down` sweeps by it.
MARKER_ENV = "TRTFORGE_TESTBED_ROOT"


def project_root() -> Path:
    """The checkout trtforge runs from (editable install: the folder holding the Makefile and the
    base pyproject.toml above this package), else the current directory."""
    for here in Path(__file__).resolve().parents:
        if (here / "pyproject.toml").is_file() and (here / "Makefile").is_file():
            return here
    return Path.cwd()


def default_root() -> Path:
    env = os.environ.get(ROOT_ENV)
    if env:
        return Path(env).resolve()
    return project_root() / ".cluster"


def cache_dir() -> Path:
    """``$TRTFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/trtforge``, else ``~/.cache/trtforge``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "trtforge" if xdg else Path.home() / ".cache" / "trtforge"


@dataclass(frozen=True)
class StatePaths:
    """The layout of one test bed's state root."""

    root: Path

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def nodes(self) -> Path:
        return self.root / "nodes"

    @property
    def pods(self) -> Path:
        return self.root / "pods"

    @property
    def volumes(self) -> Path:
        return self.root / "volumes"

    @property
    def profile_file(self) -> Path:
        """The node profile the running kubelet loaded (written by it, read by fault injection)."""
        return self.root / "profile.json"

    @property
    def expected_nodes_file(self) -> Path:
        """The node names the kubelet registers (written by it, awaited by `up`)."""
        return self.root / "nodes.expected"

    def log(self, process: str) -> Path:
        """Where a test-bed process (etcd, kube-apiserver, kubelet, ...) writes its output."""
        return self.logs / f"{process}.log"

    def pid_file(self, process: str) -> Path:
        return self.pids / f"{process}.pid"

    def node_dir(self, node: str) -> Path:
        return self.nodes / node

    def gpu_file(self, node: str) -> Path:
        return self.node_dir(node) / "gpus.json"

    def node_down_flag(self, node: str) -> Path:
        return self.node_dir(node) / "down"
