"""One emulated node: register it, heartbeat (Lease + Ready condition), keep allocatable in step with
its GPU file (the device plugin's job), and go dark when its node-down flag appears.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from trtforge.contract.gpu_probe import EmulatedGPUFile
from trtforge.logs import fields
from trtforge_dev.testbed import profile as prof
from trtforge_dev.testbed.kubelet.context import KubeletContext
from trtforge_dev.testbed.kubelet.pod import now_iso

log = logging.getLogger(__name__)

LEASE_NS = "kube-node-lease"
LEASE_DURATION_S = 40
LEASE_RENEW_S = 5.0
STATUS_EVERY_S = 10.0
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


def _micro_now() -> datetime:
    """Now, for a MicroTime field (the client writes isoformat; a zero microsecond would drop the
    fraction that the 1.20 apiserver insists on)."""
    now = datetime.now(UTC)
    return now if now.microsecond else now.replace(microsecond=1)


def sync_node_status(
    api: client.ApiClient, p: prof.NodeProfile, gpu_file: EmulatedGPUFile | None, kubelet_port: int
) -> None:
    """Write the node's status as the kubelet and device plugin would report it now."""
    f = gpu_file or EmulatedGPUFile(node=p.name, arch=p.node_arch, devices=[])
    client.CoreV1Api(api).patch_node_status(
        p.name, {"status": prof.node_status(p, f, now_iso(), kubelet_port)}
    )


def mark_unreachable(api: client.ApiClient, node: str) -> None:
    """What the node-lifecycle controller (off here) does when heartbeats stop: Ready=Unknown, the
    unreachable taints, and the node's pods not Ready."""
    core: Any = client.CoreV1Api(api)
    now = now_iso()
    cond = prof.ready_condition(False, now, "NodeStatusUnknown", "Kubelet stopped posting node status.")
    core.patch_node_status(node, {"status": {"conditions": [cond]}})
    n = core.read_node(node)
    taints = [t for t in (n.spec.taints or []) if t.key != UNREACHABLE_TAINT]
    taints += [
        client.V1Taint(key=UNREACHABLE_TAINT, effect="NoSchedule"),
        client.V1Taint(key=UNREACHABLE_TAINT, effect="NoExecute", time_added=n.metadata.creation_timestamp),
    ]
    core.patch_node(node, {"spec": {"taints": [api.sanitize_for_serialization(t) for t in taints]}})
    for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
        if pod.status.phase in ("Succeeded", "Failed"):
            continue
        conds = [{"type": "Ready", "status": "False", "lastTransitionTime": now, "reason": "NodeNotReady"}]
        try:
            core.patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace, {"status": {"conditions": conds}}
            )
        except ApiException as e:
            if e.status != 404:
                raise


class NodeAgent(threading.Thread):
    """Heartbeats for one node; calls `on_down(node)` / `on_up(node)` when its down flag changes."""

    def __init__(
        self,
        ctx: KubeletContext,
        p: prof.NodeProfile,
        on_down: Callable[[str], None],
        on_up: Callable[[str], None],
    ) -> None:
        super().__init__(name=f"node-{p.name}", daemon=True)
        self.ctx = ctx
        self.p = p
        self.core: Any = client.CoreV1Api(ctx.api)
        self.coord: Any = client.CoordinationV1Api(ctx.api)
        self.on_down = on_down
        self.on_up = on_up
        self.down = False
        self.gpu_path = ctx.paths.gpu_file(p.name)
        self.gpu_mtime = 0.0

    def effective(self) -> prof.NodeProfile:
        """The node's profile with the MIG layout a test may have set since (faults.set_mig)."""
        return prof.effective_node(self.p, self.ctx.paths.node_dir(self.p.name))

    def gpu_file(self) -> EmulatedGPUFile | None:
        return EmulatedGPUFile.read(self.gpu_path) if self.gpu_path.is_file() else None

    def register(self) -> None:
        """Create (or take over) the Node, post Ready status, drop the not-ready taint, write the GPU file."""
        node_dir = self.ctx.paths.node_dir(self.p.name)
        node_dir.mkdir(parents=True, exist_ok=True)
        p = self.effective()
        if not self.gpu_path.is_file() and p.product is not None:
            prof.gpu_file(p).write(self.gpu_path)
        body = prof.node_object(p)
        try:
            self.core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
            self.core.patch_node(self.p.name, {"metadata": {"labels": body["metadata"]["labels"]}})
        self._post_status()
        self._untaint()
        self._renew_lease()

    def _untaint(self) -> None:
        n = self.core.read_node(self.p.name)
        taints = n.spec.taints or []
        keep = [t for t in taints if t.key not in (NOT_READY_TAINT, UNREACHABLE_TAINT)]
        if len(keep) != len(taints):
            self.core.patch_node(
                self.p.name,
                {"spec": {"taints": [self.ctx.api.sanitize_for_serialization(t) for t in keep] or None}},
            )

    def _post_status(self) -> None:
        f = self.gpu_file()
        if self.gpu_path.is_file():
            self.gpu_mtime = self.gpu_path.stat().st_mtime
        sync_node_status(self.ctx.api, self.effective(), f, self.ctx.kubelet_port)

    def _renew_lease(self) -> None:
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.p.name, "namespace": LEASE_NS},
            "spec": {
                "holderIdentity": self.p.name,
                "leaseDurationSeconds": LEASE_DURATION_S,
                "renewTime": _micro_now(),
            },
        }
        try:
            self.coord.patch_namespaced_lease(self.p.name, LEASE_NS, {"spec": body["spec"]})
        except ApiException as e:
            if e.status != 404:
                raise
            self.coord.create_namespaced_lease(LEASE_NS, body)

    def run(self) -> None:
        flag = self.ctx.paths.node_down_flag(self.p.name)
        next_lease = next_status = 0.0
        while not self.ctx.stopping.is_set():
            try:
                is_down = flag.exists()
                if is_down and not self.down:
                    self.down = True
                    log.warning("node down: heartbeats stop, pods end", extra=fields(node=self.p.name))
                    self.on_down(self.p.name)
                    mark_unreachable(self.ctx.api, self.p.name)
                elif not is_down and self.down:
                    self.down = False
                    log.info("node back up", extra=fields(node=self.p.name))
                    self._post_status()
                    self._untaint()
                    self.on_up(self.p.name)
                if not self.down:
                    now = time.monotonic()
                    changed = self.gpu_path.is_file() and self.gpu_path.stat().st_mtime != self.gpu_mtime
                    if now >= next_lease:
                        self._renew_lease()
                        next_lease = now + LEASE_RENEW_S
                    if changed or now >= next_status:
                        self._post_status()
                        next_status = now + STATUS_EVERY_S
            except Exception as e:  # keep heartbeating through transient API errors
                log.warning("node heartbeat failed", extra=fields(node=self.p.name, error=str(e)))
            self.ctx.stopping.wait(0.5)
