"""What every pod worker shares: the API client, paths, node profiles, and the pod address and GPU
allocators (thread-safe)."""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client

from trtforge.contract.gpu_probe import EmulatedGPUFile, GPUDevice
from trtforge_dev.testbed import gpus
from trtforge_dev.testbed.kubelet.podspec import pod_block, pod_ip_for
from trtforge_dev.testbed.paths import MARKER_ENV, StatePaths
from trtforge_dev.testbed.profile import Profile

POD_UID_ENV = "TRTFORGE_TESTBED_POD_UID"
# Host variables a pod inherits (everything else is set by the kubelet or the pod spec).
PASS_THROUGH = (
    "LANG",
    "LC_ALL",
    "TZ",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PYTHONDONTWRITEBYTECODE",
    "TRTFORGE_LOG_FORMAT",
    "PIP_FIND_LINKS",
)


class IPAllocator:
    def __init__(self, block: int = 1) -> None:
        self.block = block
        self._lock = threading.Lock()
        self._next = 0
        self._by_uid: dict[str, str] = {}

    def acquire(self, uid: str, prefer: str | None = None) -> str:
        """The pod's address: `prefer` (its address before a restart) when free, else a new one."""
        with self._lock:
            if uid not in self._by_uid and prefer and prefer not in self._by_uid.values():
                self._by_uid[uid] = prefer
            while uid not in self._by_uid:
                ip = pod_ip_for(self._next, self.block)
                self._next += 1
                if ip not in self._by_uid.values():
                    self._by_uid[uid] = ip
            return self._by_uid[uid]

    def release(self, uid: str) -> None:
        with self._lock:
            self._by_uid.pop(uid, None)


def _mig_override_single(paths: StatePaths, node: str) -> bool:
    """Whether the MIG layout set on the running test bed (faults.set_mig) uses the single strategy."""
    from trtforge_dev.testbed.profile import MIG_OVERRIDE_FILE, MigSpec

    f = paths.node_dir(node) / MIG_OVERRIDE_FILE
    return f.is_file() and MigSpec.model_validate_json(f.read_text()).single


class GPUAllocator:
    """Device uuid -> pod uid, per node; devices come from the node's emulated GPU file."""

    def __init__(self, paths: StatePaths, single_mig_nodes: frozenset[str] = frozenset()) -> None:
        self.paths = paths
        self.single_mig_nodes = single_mig_nodes  # nodes whose MIG instances are nvidia.com/gpu
        self._lock = threading.Lock()
        self._taken: dict[str, str] = {}

    def allocate(self, node: str, pod_uid: str, wanted: dict[str, int]) -> list[GPUDevice]:
        if not wanted:
            return []
        with self._lock:
            mine = [u for u, p in self._taken.items() if p == pod_uid]
            if mine:
                f = EmulatedGPUFile.read(self.paths.gpu_file(node))
                return [d for d in f.devices if d.uuid in mine]
            path = self.paths.gpu_file(node)
            if not path.is_file():
                raise gpus.AllocationError(f"node {node} has no GPUs, the pod asks for {wanted}")
            f = EmulatedGPUFile.read(path)
            single = node in self.single_mig_nodes or _mig_override_single(self.paths, node)
            chosen = gpus.allocate(f, wanted, set(self._taken), single)
            for d in chosen:
                self._taken[d.uuid] = pod_uid
            return chosen

    def release(self, pod_uid: str) -> None:
        with self._lock:
            for u in [u for u, p in self._taken.items() if p == pod_uid]:
                del self._taken[u]


@dataclass
class KubeletContext:
    paths: StatePaths
    profile: Profile
    api: client.ApiClient
    apiserver_port: int
    kubelet_port: int = 0
    ips: IPAllocator = field(init=False)
    gpus: GPUAllocator | None = None
    stopping: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.ips = IPAllocator(pod_block(str(self.paths.root.resolve())))
        if self.gpus is None:
            self.gpus = GPUAllocator(
                self.paths, frozenset(n.name for n in self.profile.nodes if n.mig_single)
            )

    def host_paths(self) -> tuple[Path, ...]:
        """Host paths every container needs to see, whatever it mounts over them: the project (its
        code is installed in editable mode), its Python, and the test bed's state."""
        from trtforge_dev.testbed.paths import project_root

        return (project_root(), Path(sys.prefix), Path(sys.base_prefix), self.paths.root.resolve())

    def base_env(self, pod_uid: str, pod_name: str, pod_ip: str, home: Path) -> dict[str, str]:
        """The environment every container starts from: the project's venv first on PATH."""
        venv_bin = str(Path(sys.executable).parent)
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env = {k: os.environ[k] for k in PASS_THROUGH if k in os.environ}
        env.update(
            {
                "PATH": f"{venv_bin}:{path}",
                "HOME": str(home),
                "HOSTNAME": pod_name,
                "POD_IP": pod_ip,
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(self.apiserver_port),
                "KUBERNETES_SERVICE_PORT_HTTPS": str(self.apiserver_port),
                "KUBERNETES_PORT": f"tcp://127.0.0.1:{self.apiserver_port}",
                MARKER_ENV: str(self.paths.root),
                POD_UID_ENV: pod_uid,
            }
        )
        env.setdefault("LANG", "C.UTF-8")
        return env
