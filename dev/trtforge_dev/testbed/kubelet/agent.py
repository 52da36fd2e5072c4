"""The emulated kubelet process: one NodeAgent per node, the provisioner, and a pod dispatcher that
watches pods bound to our nodes and gives each its PodWorker."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from trtforge.logs import fields
from trtforge_dev.testbed.kube import list_then_watch
from trtforge_dev.testbed.kubelet.context import POD_UID_ENV, KubeletContext
from trtforge_dev.testbed.kubelet.node import NodeAgent
from trtforge_dev.testbed.kubelet.pod import PodWorker
from trtforge_dev.testbed.kubelet.provisioner import Provisioner

log = logging.getLogger(__name__)


def kill_orphans(root: Path) -> int:
    """Pods of a previous kubelet of this root (processes carrying a pod uid): SIGKILL them."""
    from trtforge_dev.testbed.paths import MARKER_ENV

    n = 0
    me = f"{MARKER_ENV}={root}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if me in env and any(e.startswith(f"{POD_UID_ENV}=".encode()) for e in env):
            with contextlib.suppress(OSError):
                os.kill(int(d.name), signal.SIGKILL)
                n += 1
    return n


class Kubelet:
    def __init__(self, ctx: KubeletContext) -> None:
        self.ctx = ctx
        self.core: Any = client.CoreV1Api(ctx.api)
        self.nodes = {n.name for n in ctx.profile.nodes}
        self.down: set[str] = set()
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self.agents = [NodeAgent(ctx, p, self.node_down, self.node_up) for p in ctx.profile.nodes]

    # --- nodes -----------------------------------------------------------------------------------
    def node_down(self, node: str) -> None:
        with self.lock:
            self.down.add(node)
            workers = [w for w in self.workers.values() if w.node == node]
        for w in workers:
            w.kill()
        for w in workers:
            w.join(timeout=10)
        with self.lock:
            for w in workers:
                if self.workers.get(w.uid) is w:
                    del self.workers[w.uid]

    def node_up(self, node: str) -> None:
        with self.lock:
            self.down.discard(node)
        self.resync()

    def container_running(self, ns: str, pod: str, container: str) -> bool:
        with self.lock:
            workers = [w for w in self.workers.values() if w.ns == ns and w.pod_name == pod]
        return any(w.container_running(container) for w in workers)

    # --- pods --------------------------------------------------------------------------------------
    def handle(self, kind: str, pod: dict[str, Any]) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in self.nodes:
            return
        uid = pod["metadata"]["uid"]
        with self.lock:
            if node in self.down:
                return
            w = self.workers.get(uid)
            if kind == "DELETED":
                if w is not None:
                    w.kill()
                    del self.workers[uid]
                return
            if w is None:
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed"):
                    # Finished before this kubelet started: only its deletion is left to do.
                    if pod["metadata"].get("deletionTimestamp"):
                        self._force_delete(pod)
                    return
                w = PodWorker(self.ctx, pod)
                self.workers[uid] = w
                w.update(pod)
                w.start()
                return
        w.update(pod)

    def _force_delete(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0),
            )

    def resync(self) -> str:
        """Handle every bound pod as listed now; end workers whose pod is gone (deleted while the
        watch was down, e.g. during an apiserver restart: its DELETED event was never seen)."""
        with self.lock:
            before = dict(self.workers)  # only these can be judged gone: others started after the list
        pods = self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=")
        listed = set()
        for p in pods.items:
            obj = self.ctx.api.sanitize_for_serialization(p)
            listed.add(obj["metadata"]["uid"])
            self.handle("ADDED", obj)
        with self.lock:
            gone = [w for uid, w in before.items() if uid not in listed and self.workers.get(uid) is w]
            for w in gone:
                w.kill()
                del self.workers[w.uid]
        if gone:
            log.info("pods gone while unwatched", extra=fields(pods=[f"{w.ns}/{w.pod_name}" for w in gone]))
        return str(pods.metadata.resource_version)

    def watch_pods(self) -> None:
        list_then_watch(
            self.resync,
            self.core.list_pod_for_all_namespaces,
            self.handle,
            self.ctx.stopping.is_set,
            self._watch_failed,
            field_selector="spec.nodeName!=",
        )

    @staticmethod
    def _watch_failed(e: BaseException) -> None:
        status = e.status if isinstance(e, ApiException) else None
        log.warning("pod watch failed", extra=fields(status=status, error=str(e)[:300]))

    # --- the process ---------------------------------------------------------------------------
    def run(self) -> None:
        killed = kill_orphans(self.ctx.paths.root)
        if killed:
            log.warning("killed pods left by a previous kubelet", extra=fields(count=killed))
        prov = Provisioner(self.ctx)
        prov.ensure_class()
        for a in self.agents:
            a.register()
        self.ctx.paths.expected_nodes_file.write_text("\n".join(sorted(self.nodes)) + "\n")
        log.info("nodes registered", extra=fields(nodes=sorted(self.nodes)))
        for a in self.agents:
            a.start()
        prov.start()
        if self.ctx.kubelet_port:
            from trtforge_dev.testbed.kubelet.logserver import LogServer
            from trtforge_dev.testbed.pki import PKI

            pki = PKI(self.ctx.paths.pki)
            LogServer(
                self.ctx.paths,
                self.ctx.kubelet_port,
                pki.serving_cert,
                pki.serving_key,
                self.container_running,
                self.ctx.stopping,
            ).start()
        t = threading.Thread(target=self.watch_pods, name="pod-watch", daemon=True)
        t.start()
        self.ctx.stopping.wait()
        self.shutdown()

    def shutdown(self) -> None:
        with self.lock:
            workers = list(self.workers.values())
        for w in workers:
            w.kill()
        for w in workers:
            w.join(timeout=10)
        kill_orphans(self.ctx.paths.root)
