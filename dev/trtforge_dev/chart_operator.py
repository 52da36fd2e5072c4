"""The operator and the engine broker installed from the chart's rendered manifests on the test bed,
and the tools the HA tests and benchmarks use on it: which pod leads, SIGKILL a pod's container, cut
one pod off the apiserver, read the replicas' JSON logs.

Test-bed adaptations of the rendered chart (and only these): the operator and broker containers get
`command: [trtforge]` (the emulated kubelet ignores images); they listen on their pod IP (pods share
the host's network here); they reach the apiserver through a TCP proxy the test controls; and the
broker URL runtime pods get is a local forwarder to the broker Service's ready endpoints, the broker
Deployment's ready pods (what kube-proxy would do; the test bed has no Service IPs or DNS).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from trtforge_dev import localdev
from trtforge_dev.localdev import deployment_manifest, engine_manifest, is_true, tiny_model
from trtforge_dev.testbed.chart import apply, delete, for_testbed, kube_version, render
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.kubelet.context import POD_UID_ENV
from trtforge_dev.testbed.wait import wait_for

RELEASE = "ha"
FULLNAME = f"{RELEASE}-trtforge"
LEASE = "trtforge-operator"
OPERATOR, BROKER = "operator", "broker"  # app.kubernetes.io/component, and the container's name


# ------------------------------------------------------------------------------------ TCP proxies


def _proc_env(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def _socket_inode(local_port: int, remote_port: int) -> str | None:
    """The inode of the 127.0.0.1:local_port -> :remote_port TCP socket (from /proc/net/tcp)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        local, remote, inode = parts[1], parts[2], parts[9]
        if int(local.split(":")[1], 16) == local_port and int(remote.split(":")[1], 16) == remote_port:
            return inode
    return None


def pod_of_peer(peer_port: int, proxy_port: int) -> str:
    """The POD_NAME of the process that owns the client end of a connection to the proxy ("" if none)."""
    inode = _socket_inode(peer_port, proxy_port)
    if inode is None:
        return ""
    target = f"socket:[{inode}]"
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{d}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{d}/fd/{fd}") == target:
                    return _proc_env(d).get("POD_NAME", "")
            except OSError:
                continue
    return ""


class TCPProxy:
    """127.0.0.1:<port> → an upstream chosen per connection. `cut(pod)` partitions one pod: its open
    connections are closed and new ones are accepted and never answered (packets lost), while every
    other client goes on as before. `heal()` ends the partition."""

    def __init__(self, upstream: Callable[[], tuple[str, int]], identify: bool = False) -> None:
        self.upstream, self.identify = upstream, identify
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.cut_pods: set[str] = set()
        self.conns: list[tuple[str, socket.socket, socket.socket | None]] = []
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    def cut(self, pod: str) -> None:
        with self.lock:
            self.cut_pods.add(pod)
            doomed = [(a, b) for p, a, b in self.conns if p == pod]
        for a, b in doomed:
            for s in (a, b):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                    s.close()

    def heal(self) -> None:
        with self.lock:
            self.cut_pods.clear()

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, peer[1]), daemon=True).start()

    def _serve(self, conn: socket.socket, peer_port: int) -> None:
        pod = pod_of_peer(peer_port, self.port) if self.identify else ""
        with self.lock:
            blackholed = pod in self.cut_pods
        if blackholed:
            with self.lock:
                self.conns.append((pod, conn, None))
            with contextlib.suppress(OSError):
                while conn.recv(65536):
                    pass
            conn.close()
            return
        try:
            up = socket.create_connection(self.upstream(), timeout=5)
        except OSError:
            conn.close()
            return
        up.settimeout(None)
        with self.lock:
            self.conns.append((pod, conn, up))
        threading.Thread(target=self._pump, args=(up, conn), daemon=True).start()
        self._pump(conn, up)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


# ------------------------------------------------------------------------------------ the install


class ChartOperator:
    """The chart rendered by Helm and applied to a fresh release namespace, watching one tenant."""

    def __init__(self, tb: TestBed, workdir: Path, values: dict[str, Any] | None = None) -> None:
        tag = secrets.token_hex(3)
        self.tb, self.workdir = tb, workdir
        self.ns, self.tenant = f"ha-{tag}", f"ha-tenant-{tag}"
        self.api = tb.api_client()
        self.core: Any = client.CoreV1Api(self.api)
        self.coord: Any = client.CoordinationV1Api(self.api)
        self.apiserver = TCPProxy(lambda: ("127.0.0.1", tb.state.apiserver_port), identify=True)
        self.broker = TCPProxy(self._broker_endpoint)
        self._last_broker: list[tuple[str, int]] = []
        self._rr = 0
        self.extra_values = values or {}
        self.docs: list[dict[str, Any]] = []
        self.skipped: list[tuple[str, str]] = []

    # --- install / uninstall
    def values(self) -> dict[str, Any]:
        env = [
            {
                "name": "TRTFORGE_OPERATOR_BIND_ADDRESS",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
            },
            # Pods share one network here: the operator's pod-local /metrics (metrics.bindAddress
            # 127.0.0.1) listens on its pod IP instead, so replicas and test beds never collide.
            {
                "name": "TRTFORGE_OPERATOR_METRICS_BIND_ADDRESS",
                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
            },
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(self.apiserver.port)},
        ]
        v: dict[str, Any] = {
            "operator": {
                "replicas": 2,
                "watchNamespaces": [self.tenant],
                "logFormat": "json",
                "extraEnv": env,
            },
            "broker": {"replicas": 2, "extraEnv": env},
            "store": {"pvc": {"storageClassName": "trtforge-local", "size": "1Gi"}},
            "engineBackends": {"gpu": "onnxruntime", "cpu": "onnxruntime"},  # the emulated GPUs
            "build": {"cpu": "100m", "memory": "1Gi", "retryBaseSeconds": 5, "maxConcurrentPerNamespace": 4},
        }
        for k, val in self.extra_values.items():
            v[k] = {**v.get(k, {}), **val} if isinstance(val, dict) else val
        return v

    def install(self) -> None:
        localdev.install_crds(self.tb)
        for ns in (self.ns, self.tenant):
            localdev.ensure_namespace(self.api, ns)
        # The tenant's own model claim (model sources stay in the TRTEngine's namespace).
        self.models_dir = self.workdir / "models"
        self.models_pv = localdev.tenant_models_claim(self.api, self.tenant, self.models_dir)
        docs, _ = render(RELEASE, self.ns, self.values(), kube_version=kube_version(self.tb))
        self.docs = for_testbed(docs, broker_url=f"http://127.0.0.1:{self.broker.port}")
        self.skipped = apply(self.tb, self.docs)

    def wait_ready(self, timeout: float = 180) -> None:
        def ready() -> bool:
            pods, brokers = self.pods(), self.pods(component=BROKER)
            return (
                len(pods) == 2
                and all(_ready(p) for p in pods)
                and self.holder() is not None
                and len(brokers) == 2
                and all(_ready(p) for p in brokers)
            )

        wait_for(
            ready, timeout=timeout, desc="2 operator replicas ready, one holding the Lease; 2 brokers ready"
        )

    def close(self) -> None:
        co: Any = client.CustomObjectsApi(self.api)
        for plural in ("inferencedeployments", "trtengines"):
            with contextlib.suppress(ApiException):
                for o in co.list_namespaced_custom_object("trtforge.io", "v1alpha1", self.tenant, plural)[
                    "items"
                ]:
                    co.delete_namespaced_custom_object(
                        "trtforge.io", "v1alpha1", self.tenant, plural, o["metadata"]["name"]
                    )
        with contextlib.suppress(Exception):
            wait_for(
                lambda: (
                    not any(
                        co.list_namespaced_custom_object("trtforge.io", "v1alpha1", self.tenant, p)["items"]
                        for p in ("inferencedeployments", "trtengines")
                    )
                ),
                timeout=60,
                desc="tenant resources deleted",
            )
        if self.docs:
            delete(self.tb, self.docs)
        for ns in (self.tenant, self.ns):
            with contextlib.suppress(ApiException):
                self.core.delete_namespace(ns)
        with contextlib.suppress(ApiException, AttributeError):
            self.core.delete_persistent_volume(self.models_pv)
        self.apiserver.close()
        self.broker.close()
        self.api.close()

    # --- the broker Service, as kube-proxy would serve it
    def _broker_endpoint(self) -> tuple[str, int]:
        """A ready broker pod's port, round robin (the broker Service's endpoints; the test bed's
        endpoints controller leaves its 127.N.x.y pod addresses out, so they are read from the pods
        the Service selects)."""
        try:
            found = [
                (p.status.pod_ip, port.container_port)
                for p in self.pods(timeout=2, component=BROKER)
                if _ready(p) and p.status.pod_ip
                for c in p.spec.containers
                for port in c.ports or []
                if port.name == "broker"
            ]
            if found:
                self._last_broker = found
        except Exception:
            pass  # the apiserver is down: keep the last endpoints, as kube-proxy does
        if not self._last_broker:
            raise OSError("no ready broker endpoint")
        self._rr += 1
        return self._last_broker[self._rr % len(self._last_broker)]

    # --- who is who
    def pods(self, timeout: float | None = None, component: str = OPERATOR) -> list[Any]:
        """The release's live operator (or broker) pods."""
        sel = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        kw = {"_request_timeout": timeout} if timeout else {}
        return [
            p
            for p in self.core.list_namespaced_pod(self.ns, label_selector=sel, **kw).items
            if not p.metadata.deletion_timestamp
        ]

    def lease(self) -> Any:
        return self.coord.read_namespaced_lease(LEASE, self.ns)

    def holder(self) -> str | None:
        try:
            h = self.lease().spec.holder_identity
        except ApiException:
            return None
        return h or None

    def leader_pod(self) -> str:
        h = self.holder()
        assert h, "no replica holds the Lease"
        return pod_of_identity(h)

    def kill_container(self, pod: str) -> float:
        """SIGKILL every process of the pod's container (a crash); the kubelet restarts it. Returns when."""
        p = self.core.read_namespaced_pod(pod, self.ns)
        uid = p.metadata.uid
        pids = [d for d in os.listdir("/proc") if d.isdigit() and _proc_env(d).get(POD_UID_ENV) == uid]
        assert pids, f"no process of pod {pod}"
        t = time.time()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        return t

    def logs(self, pod: str, previous: bool = False, container: str = OPERATOR) -> list[dict[str, Any]]:
        text = self.tb.pod_log(self.ns, pod, container, previous=previous)
        out = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict):
                    out.append(obj)
        return out

    # --- tenants' objects
    def apply_obj(self, obj: dict[str, Any]) -> None:
        self.tb.kubectl("apply", "-n", self.tenant, "-f", "-", input=yaml.safe_dump(obj))

    def get(self, plural: str, name: str) -> dict[str, Any]:
        return localdev.get_custom(self.api, plural, self.tenant, name)

    def jobs_for(self, engine: str) -> list[Any]:
        jobs = client.BatchV1Api(self.api).list_namespaced_job(self.ns).items
        me = f"{self.tenant}/{engine}"
        return [j for j in jobs if j.metadata and me in (j.metadata.annotations or {}).values()]


def pod_of_identity(identity: str) -> str:
    """A Lease holder identity is `<pod name>_<random>`."""
    return identity.rsplit("_", 1)[0]


def _container_state(p: Any) -> str:
    """`running`, `waiting:<reason>` or `terminated` of a pod's first container, or `pending`."""
    for cs in p.status.container_statuses or []:
        if cs.state.running:
            return "running" + (" (ready)" if cs.ready else "")
        if cs.state.waiting:
            return f"waiting:{cs.state.waiting.reason}"
        return "terminated"
    return "pending"


def _ready(p: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))


@contextlib.contextmanager
def installed(tb: TestBed, workdir: Path) -> Iterator[ChartOperator]:
    op = ChartOperator(tb, workdir)
    try:
        op.install()
        op.wait_ready()
        yield op
    finally:
        op.close()


def first_line(logs: list[dict[str, Any]], msg: str, after: float = 0.0) -> dict[str, Any] | None:
    for entry in logs:
        if entry.get("msg") == msg and float(entry.get("at", entry.get("ts", 0)) or 0) >= after:
            return entry
    return None


# ------------------------------------------------------------------------------------ scenarios
# Used by tests/integration/test_ha.py (which asserts order and outcome) and benchmarks/ha.py (which
# repeats them and records the times).

H100 = "NVIDIA-H100-80GB-HBM3"
GH200 = "NVIDIA-GH200-480GB"
B200 = "NVIDIA-B200"
TARGETS = [{"gpu": H100}, {"gpu": GH200}, {"gpu": B200, "mig": "1g.23gb"}]


def other_holder(ha: ChartOperator, old_identity: str) -> str | None:
    h = ha.holder()
    return h if h and h != old_identity else None


def if_ready(obj: dict[str, Any]) -> dict[str, Any] | None:
    return obj if is_true(obj, "Ready") else None


def leader_killed_mid_build(ha: ChartOperator, seed: int) -> dict[str, Any]:
    """One round: a fresh 3-target engine, the leader SIGKILLed once its first build Job exists.
    Returns the outcome and times (seconds from the kill)."""
    name = f"ha-kill-{seed}"
    sha = tiny_model(ha.models_dir / f"{name}.onnx", seed=seed)
    ha.apply_obj(engine_manifest(name, sha, TARGETS, model=f"pvc://models/{name}.onnx"))
    wait_for(lambda: ha.jobs_for(name), timeout=120, desc=f"a build Job of {name}")
    eng = ha.get("trtengines", name)
    ready_at_kill = (eng.get("status") or {}).get("readyTargets")
    old_identity = ha.lease().spec.holder_identity
    old_pod = pod_of_identity(old_identity)
    pods_at_kill = sorted(p.metadata.name for p in ha.pods())
    killed_at = ha.kill_container(old_pod)

    identity = wait_for(
        lambda: other_holder(ha, old_identity),
        timeout=120,
        interval=0.2,
        desc="another replica holding the Lease",
    )
    acquired = ha.lease().spec.acquire_time.timestamp()
    ready = wait_for(
        lambda: if_ready(ha.get("trtengines", name)),
        timeout=300,
        desc=f"{name} Ready",
    )
    assert ready is not None  # wait_for returns only a truthy value
    ready_at = time.time()
    jobs = ha.jobs_for(name)
    keys = [(j.metadata.annotations or {}).get("trtforge.io/request-digest", "") for j in jobs]
    return {
        "killed_pod": old_pod,
        "pods_at_kill": pods_at_kill,
        "new_leader_pod": pod_of_identity(str(identity)),
        "ready_targets_at_kill": ready_at_kill,
        "takeover_s": round(acquired - killed_at, 2),
        "ready_after_kill_s": round(ready_at - killed_at, 1),
        "ready_targets": ready["status"]["readyTargets"],
        "target_keys": sorted(t.get("requestKey", "") for t in ready["status"]["targets"]),
        "job_keys": sorted(keys),
    }


def apiserver_killed_mid_rollout(
    ha: ChartOperator, tb: TestBed, name: str, seed: int, down_s: float = 25.0
) -> dict[str, Any]:
    """Build an engine, start a 2-replica rollout, SIGKILL the apiserver while its pods start, bring
    it back after `down_s`; the InferenceDeployment's readiness and the time from the return."""
    sha = tiny_model(ha.models_dir / f"{name}.onnx", seed=seed)
    ha.apply_obj(engine_manifest(name, sha, [{"gpu": H100}], model=f"pvc://models/{name}.onnx"))
    wait_for(lambda: is_true(ha.get("trtengines", name), "Ready"), timeout=300, desc=f"{name} built")
    ha.apply_obj(deployment_manifest(name, name, replicas=2))
    sel = f"trtforge.io/inferencedeployment={name}"

    def starting() -> list[Any]:
        """The rollout's pods once one has its container running and not yet ready (fetching)."""
        pods = ha.core.list_namespaced_pod(ha.tenant, label_selector=sel).items
        return pods if any(_container_state(p) == "running" for p in pods) else []

    pods = wait_for(starting, timeout=120, interval=0.05, desc="a runtime container started")
    states = sorted(_container_state(p) for p in pods)
    tb.kill_apiserver()
    down_at = time.monotonic()
    time.sleep(down_s)  # the outage under test
    tb.start_apiserver()
    back_at = time.monotonic()
    infd = wait_for(
        lambda: if_ready(ha.get("inferencedeployments", name)),
        timeout=300,
        interval=0.5,
        desc=f"{name} Ready after the apiserver came back",
        ignore=(Exception,),
    )
    assert infd is not None  # wait_for returns only a truthy value
    ready_s = time.monotonic() - back_at
    exits_80 = [
        p.metadata.name
        for p in ha.core.list_namespaced_pod(ha.tenant, label_selector=sel).items
        for cs in p.status.container_statuses or []
        if cs.last_state and cs.last_state.terminated and cs.last_state.terminated.exit_code == 80
    ]
    retries = sum(
        ha.tb.pod_log(ha.tenant, p.metadata.name, "serve").count("store unavailable; retrying")
        for p in ha.core.list_namespaced_pod(ha.tenant, label_selector=sel).items
    )
    return {
        "runtime_fetch_retries": retries,
        "runtime_pods_at_kill": len(pods),
        "runtime_states_at_kill": states,
        "down_s": round(back_at - down_at, 1),
        "ready_after_return_s": round(ready_s, 1),
        "ready": infd["status"]["ready"],
        "exits_80": exits_80,
    }
