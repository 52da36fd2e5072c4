"""`up`, `down` and `status` of the control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, plus the emulated kubelet (one process for all emulated nodes).

All state lives under the state root (``.cluster/``); every `up` starts from an empty etcd.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from trtforge.logs import fields
from trtforge_dev.testbed import procs
from trtforge_dev.testbed.binaries import Binaries, resolve
from trtforge_dev.testbed.paths import StatePaths
from trtforge_dev.testbed.pki import FRONT_PROXY_CLIENT, PKI, ensure_front_proxy, ensure_pki
from trtforge_dev.testbed.profile import load_profile

log = logging.getLogger(__name__)

SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CIDR = "10.0.0.0/24"
# Stopped in this order by `down` (the kubelet first, so it ends its pods).
COMPONENTS = ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
CONTROLLERS = ",".join(
    [
        "job",
        "cronjob",
        "deployment",
        "replicaset",
        "statefulset",
        "daemonset",
        "garbagecollector",
        "namespace",
        "serviceaccount",
        "serviceaccount-token",
        "endpoint",
        "endpointslice",
        "podgc",
        "persistentvolume-binder",
        "pvc-protection",
        "pv-protection",
        "resourcequota",
        "disruption",
        "csrsigning",
        "csrapproving",
        "root-ca-cert-publisher",
        "clusterrole-aggregation",
        "horizontalpodautoscaling",
    ]
)


class ClusterError(RuntimeError):
    """The test bed cannot do what was asked; the message says what to do."""


class AlreadyUpError(ClusterError):
    pass


@dataclass
class ClusterState:
    """What `up` recorded: ports and the binaries it ran."""

    root: str
    apiserver_port: int
    etcd_port: int
    etcd_peer_port: int
    binaries: dict[str, str]
    started_at: float
    profile: str | None = None
    kubelet_port: int = 0

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def save(self, paths: StatePaths) -> None:
        paths.state_file.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, paths: StatePaths) -> ClusterState | None:
        try:
            return cls(**json.loads(paths.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def running_components(paths: StatePaths) -> dict[str, int | None]:
    """Component -> pid if its recorded process is alive, else None."""
    out: dict[str, int | None] = {}
    for c in COMPONENTS:
        pid = procs.read_pid(paths, c)
        out[c] = pid if pid is not None and procs.is_alive(pid) else None
    return out


def is_up(paths: StatePaths) -> bool:
    return ClusterState.load(paths) is not None and running_components(paths)["kube-apiserver"] is not None


def write_kubeconfig(path: Path, server: str, pki: PKI) -> None:
    import base64

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    cfg: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "trtforge-testbed",
        "clusters": [
            {
                "name": "trtforge-testbed",
                "cluster": {"server": server, "certificate-authority-data": b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": "trtforge-admin",
                "user": {
                    "client-certificate-data": b64(pki.admin_cert),
                    "client-key-data": b64(pki.admin_key),
                },
            }
        ],
        "contexts": [
            {"name": "trtforge-testbed", "context": {"cluster": "trtforge-testbed", "user": "trtforge-admin"}}
        ],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg))
    tmp.chmod(0o600)
    os.replace(tmp, path)


def _ssl_context(pki: PKI) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    return ctx


def _get(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")


def _log_tail(paths: StatePaths, name: str, n: int = 15) -> str:
    try:
        lines = paths.log(name).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def _wait_healthy(
    paths: StatePaths, name: str, pid: int, url: str, ctx: ssl.SSLContext | None, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if not procs.is_alive(pid):
            tail = _log_tail(paths, name)
            if "address already in use" in tail:
                raise ClusterError(
                    f"{name} could not listen: a port is already in use; run "
                    f"`trtforge cluster up` again to pick other free ports. Log:\n{tail}"
                )
            raise ClusterError(f"{name} exited during start-up; see {paths.log(name)}:\n{tail}")
        try:
            code, body = _get(url, ctx)
            if code == 200:
                return
            last = f"HTTP {code}: {body[:200]}"
        except (OSError, urllib.error.URLError) as e:
            last = str(e)
        time.sleep(0.2)
    raise ClusterError(f"{name} was not healthy after {timeout:g}s ({last}); see {paths.log(name)}")


def check_unshare() -> None:
    """The emulated kubelet needs private mount namespaces; fail early and clearly without them."""
    if shutil.which("unshare") is None:
        raise ClusterError("`unshare` (util-linux) is missing: `sudo apt-get install -y util-linux`")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True)
    if r.returncode != 0:
        raise ClusterError(
            "the emulated kubelet runs each container in its own mount namespace, but "
            f"`unshare -m` is not permitted here ({r.stderr.strip()}): run the test bed as root "
            "(or in a container with CAP_SYS_ADMIN)"
        )


def _apiserver_argv(b: Binaries, st: ClusterState, pki: PKI) -> list[str]:
    return [
        str(b.kube_apiserver),
        f"--etcd-servers=http://127.0.0.1:{st.etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={st.apiserver_port}",
        "--insecure-port=0",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--kubelet-client-certificate={pki.admin_cert}",
        f"--kubelet-client-key={pki.admin_key}",
        "--kubelet-preferred-address-types=InternalIP",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={SA_ISSUER}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--api-audiences={SA_ISSUER}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        "--enable-priority-and-fairness=false",
        f"--cert-dir={pki.dir}",
        # API aggregation (the custom metrics API of trtforge_dev.testbed.metrics_adapter): with no
        # kube-proxy, the apiserver dials an aggregated API's endpoint IP, not its Service IP.
        "--enable-aggregator-routing=true",
        f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
        f"--proxy-client-key-file={pki.front_proxy_client_key}",
        "--v=1",
    ]


def _controller_manager_argv(b: Binaries, paths: StatePaths, pki: PKI) -> list[str]:
    return [
        str(b.kube_controller_manager),
        f"--kubeconfig={paths.kubeconfig}",
        "--leader-elect=false",
        "--port=0",
        "--secure-port=0",
        f"--controllers={CONTROLLERS}",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        "--use-service-account-credentials=false",
        "--concurrent-gc-syncs=5",
        # The HPA controller, in a test's time: it syncs every 3 s (15 s by default), and scale-downs
        # wait 15 s of lower recommendations (5 min by default). Product defaults are untouched.
        "--horizontal-pod-autoscaler-sync-period=3s",
        "--horizontal-pod-autoscaler-downscale-stabilization=15s",
        # The PV binder looks at a Pending claim again every 2 s (15 s by default): a volume made for
        # a claim by name (claimRef without a uid) binds it only on that look.
        "--pvclaimbinder-sync-period=2s",
        "--v=1",
    ]


def _scheduler_argv(b: Binaries, paths: StatePaths) -> list[str]:
    return [
        str(b.kube_scheduler),
        f"--kubeconfig={paths.kubeconfig}",
        "--leader-elect=false",
        "--port=0",
        "--secure-port=0",
        "--v=1",
    ]


def _clean_state(paths: StatePaths) -> None:
    """Forget the previous cluster's data (etcd, pods, volumes, nodes); keep the PKI."""
    for d in (paths.etcd_data, paths.pods, paths.volumes, paths.nodes, paths.pids):
        shutil.rmtree(d, ignore_errors=True)
    for f in (paths.state_file, paths.kubeconfig):
        f.unlink(missing_ok=True)
    if paths.logs.is_dir():
        for f in paths.logs.glob("*.log"):
            f.unlink()


def up(
    paths: StatePaths,
    *,
    apiserver_port: int | None = None,
    profile: Path | None = None,
    timeout_s: float = 120.0,
) -> ClusterState:
    """Start everything and wait until every emulated node is Ready. Raises AlreadyUpError if up."""
    if is_up(paths):
        st = ClusterState.load(paths)
        assert st is not None
        if running_components(paths)["kubelet"] is None:
            log.warning(
                "the emulated kubelet is not running: restarting it", extra=fields(root=str(paths.root))
            )
            _start_kubelet(paths, st)
            _wait_ready(paths, st, timeout_s)
            return st
        raise AlreadyUpError(
            f"the test bed at {paths.root} is already up ({st.server}, kubeconfig "
            f"{paths.kubeconfig}); use it, or `trtforge cluster down` first"
        )
    t0 = time.monotonic()
    binaries = resolve()
    load_profile(profile)  # a bad node profile fails here, before anything starts
    check_unshare()
    if any(running_components(paths).values()) or procs.marked_pids(paths.root):
        log.warning("cleaning up the remains of a previous test bed", extra=fields(root=str(paths.root)))
        down(paths)
    if apiserver_port is not None:
        procs.check_port_free(apiserver_port, "kube-apiserver")
    paths.root.mkdir(parents=True, exist_ok=True)
    _clean_state(paths)
    pki = ensure_pki(paths.pki)
    ensure_front_proxy(pki)
    any_apiserver, etcd_port, etcd_peer_port, kubelet_port = procs.free_ports(4)
    st = ClusterState(
        root=str(paths.root),
        apiserver_port=apiserver_port or any_apiserver,
        etcd_port=etcd_port,
        etcd_peer_port=etcd_peer_port,
        binaries=binaries.as_dict(),
        started_at=time.time(),
        profile=str(profile.resolve()) if profile else None,
        kubelet_port=kubelet_port,
    )
    if len({st.apiserver_port, st.etcd_port, st.etcd_peer_port, st.kubelet_port}) != 4:
        raise ClusterError("could not find four distinct free ports on 127.0.0.1; run `up` again")
    st.save(paths)
    write_kubeconfig(paths.kubeconfig, st.server, pki)
    try:
        _start_all(paths, st, binaries, pki, timeout_s)
    except BaseException:
        log.error("start-up failed; stopping what was started", extra=fields(root=str(paths.root)))
        down(paths)
        raise
    log.info(
        "test bed up",
        extra=fields(
            server=st.server, kubeconfig=str(paths.kubeconfig), seconds=round(time.monotonic() - t0, 1)
        ),
    )
    return st


def _start_all(paths: StatePaths, st: ClusterState, b: Binaries, pki: PKI, timeout_s: float) -> None:
    url = f"http://127.0.0.1:{st.etcd_port}"
    pid = procs.spawn(
        paths,
        "etcd",
        [
            str(b.etcd),
            "--name=trtforge",
            f"--data-dir={paths.etcd_data}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{st.etcd_peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{st.etcd_peer_port}",
            f"--initial-cluster=trtforge=http://127.0.0.1:{st.etcd_peer_port}",
            "--snapshot-count=5000",
            "--log-level=warn",
        ],
    )
    log.info("etcd starting", extra=fields(pid=pid, url=url))
    _wait_healthy(paths, "etcd", pid, f"{url}/health", None, 30)

    pid = procs.spawn(paths, "kube-apiserver", _apiserver_argv(b, st, pki))
    log.info("kube-apiserver starting", extra=fields(pid=pid, server=st.server))
    ctx = _ssl_context(pki)
    _wait_healthy(paths, "kube-apiserver", pid, f"{st.server}/readyz", ctx, timeout_s)

    pid = procs.spawn(paths, "kube-controller-manager", _controller_manager_argv(b, paths, pki))
    log.info("kube-controller-manager started", extra=fields(pid=pid))
    pid = procs.spawn(paths, "kube-scheduler", _scheduler_argv(b, paths))
    log.info("kube-scheduler started", extra=fields(pid=pid))

    _start_kubelet(paths, st)
    _wait_ready(paths, st, timeout_s)


def _start_kubelet(paths: StatePaths, st: ClusterState) -> None:
    """Start the emulated kubelet; a restarted one takes over its nodes and pods."""
    argv = [sys.executable, "-m", "trtforge_dev.testbed.kubelet", "--root", str(paths.root)]
    if st.profile:
        argv += ["--profile", st.profile]
    pid = procs.spawn(paths, "kubelet", argv)
    log.info("emulated kubelet started", extra=fields(pid=pid))


def _wait_ready(paths: StatePaths, st: ClusterState, timeout_s: float) -> None:
    """Nodes registered Ready, and the controllers working (the default ServiceAccount exists)."""
    from kubernetes import client

    from trtforge_dev.testbed.kube import api_client
    from trtforge_dev.testbed.wait import WaitTimeout, wait_for

    api: Any = client.CoreV1Api(api_client(paths.kubeconfig))
    expected = _expected_nodes(paths)

    def ready() -> object:
        for c in COMPONENTS:
            pid = procs.read_pid(paths, c)
            if pid is None or not procs.is_alive(pid):
                raise ClusterError(f"{c} exited during start-up; see {paths.log(c)}:\n{_log_tail(paths, c)}")
        nodes = api.list_node().items
        names = {n.metadata.name for n in nodes if _node_ready(n)}
        if expected is not None and not expected <= names:
            return None
        if not names:
            return None
        sas = api.list_namespaced_service_account("default").items
        return names if sas else None

    try:
        wait_for(
            ready,
            timeout=timeout_s,
            interval=0.25,
            desc="emulated nodes Ready and controllers up",
            ignore=(OSError,),
        )
    except WaitTimeout as e:
        raise ClusterError(f"{e}; see the logs under {paths.logs}") from e


def _expected_nodes(paths: StatePaths) -> set[str] | None:
    f = paths.expected_nodes_file
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if f.is_file():
            return set(f.read_text().split())
        time.sleep(0.1)
    return None


def _node_ready(node: Any) -> bool:
    for c in (node.status.conditions or []) if node.status else []:
        if c.type == "Ready":
            return bool(c.status == "True")
    return False


def kill_apiserver(paths: StatePaths) -> int:
    """SIGKILL the kube-apiserver, as a crash would; returns its pid. Everything else keeps running."""
    pid = procs.read_pid(paths, "kube-apiserver")
    if pid is None or not procs.is_alive(pid):
        raise ClusterError(f"no kube-apiserver running for the test bed at {paths.root}")
    os.kill(pid, signal.SIGKILL)
    while procs.is_alive(pid):
        time.sleep(0.02)
    log.warning("kube-apiserver killed", extra=fields(pid=pid))
    return pid


def start_apiserver(paths: StatePaths, timeout_s: float = 60.0) -> int:
    """Start the kube-apiserver again with the flags it had (same port, PKI and etcd); wait for /readyz."""
    st = ClusterState.load(paths)
    if st is None:
        raise ClusterError(f"the test bed at {paths.root} is not up")
    pid = procs.read_pid(paths, "kube-apiserver")
    if pid is not None and procs.is_alive(pid):
        raise ClusterError(f"kube-apiserver is already running (pid {pid})")
    pki = ensure_pki(paths.pki)
    ensure_front_proxy(pki)
    b = Binaries(**{k.replace("-", "_"): Path(v) for k, v in st.binaries.items()})
    pid = procs.spawn(paths, "kube-apiserver", _apiserver_argv(b, st, pki))
    _wait_healthy(paths, "kube-apiserver", pid, f"{st.server}/readyz", _ssl_context(pki), timeout_s)
    log.info("kube-apiserver restarted", extra=fields(pid=pid))
    return pid


def down(paths: StatePaths) -> list[str]:
    """Stop every process this root started, by pid, then any marked leftover; returns what it stopped."""
    stopped = []
    for c in COMPONENTS:
        pid = procs.read_pid(paths, c)
        if pid is not None and procs.is_alive(pid):
            procs.stop(pid, paths.root, grace_s=15.0 if c == "kubelet" else 10.0)
            stopped.append(f"{c} (pid {pid})")
        paths.pid_file(c).unlink(missing_ok=True)
    for pid in procs.sweep(paths.root):
        stopped.append(f"leftover pid {pid}")
    paths.state_file.unlink(missing_ok=True)
    return stopped


def status(paths: StatePaths) -> dict[str, Any]:
    """Components with pids, the server, and readiness (nothing is started)."""
    st = ClusterState.load(paths)
    comps = running_components(paths)
    out: dict[str, Any] = {
        "root": str(paths.root),
        "up": st is not None and comps["kube-apiserver"] is not None,
        "components": comps,
    }
    if st is not None:
        out["server"] = st.server
        out["kubeconfig"] = str(paths.kubeconfig)
        pki = PKI(paths.pki)
        if comps["kube-apiserver"] is not None and pki.complete():
            try:
                code, _ = _get(f"{st.server}/readyz", _ssl_context(pki))
                out["apiserver_ready"] = code == 200
            except OSError:
                out["apiserver_ready"] = False
    return out
