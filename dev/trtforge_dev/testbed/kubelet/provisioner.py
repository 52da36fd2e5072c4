"""The provisioner of the test StorageClass `trtforge-local`: each claim gets a PV backed by a
directory under the state root (`volumes/`); released volumes are deleted with their directory.
"""

from __future__ import annotations

import logging
import shutil
import threading
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from trtforge.logs import fields
from trtforge_dev.testbed.kubelet.context import KubeletContext

log = logging.getLogger(__name__)

STORAGE_CLASS = "trtforge-local"
PROVISIONER = "trtforge.io/local-dir"
PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def pv_for(pvc: Any, path: str) -> dict[str, Any]:
    """The PV answering `pvc` (pre-bound to it through claimRef)."""
    size = ((pvc.spec.resources.requests or {}) if pvc.spec.resources else {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pvc-{pvc.metadata.uid}", "annotations": {PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": pvc.spec.access_modes or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": path, "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": pvc.metadata.namespace,
                "name": pvc.metadata.name,
                "uid": pvc.metadata.uid,
            },
        },
    }


class Provisioner(threading.Thread):
    def __init__(self, ctx: KubeletContext, interval_s: float = 0.5) -> None:
        super().__init__(name="provisioner", daemon=True)
        self.ctx = ctx
        self.core: Any = client.CoreV1Api(ctx.api)
        self.interval_s = interval_s

    def ensure_class(self) -> None:
        try:
            storage: Any = client.StorageV1Api(self.ctx.api)
            storage.create_storage_class(storage_class())
        except ApiException as e:
            if e.status != 409:
                raise

    def once(self) -> None:
        pvs = {pv.metadata.name: pv for pv in self.core.list_persistent_volume().items}
        for pvc in self.core.list_persistent_volume_claim_for_all_namespaces().items:
            if pvc.spec.storage_class_name != STORAGE_CLASS or pvc.spec.volume_name:
                continue
            if pvc.metadata.deletion_timestamp or f"pvc-{pvc.metadata.uid}" in pvs:
                continue
            path = self.ctx.paths.volumes / f"pvc-{pvc.metadata.uid}"
            path.mkdir(parents=True, exist_ok=True)
            try:
                self.core.create_persistent_volume(pv_for(pvc, str(path)))
                log.info(
                    "volume provisioned",
                    extra=fields(claim=f"{pvc.metadata.namespace}/{pvc.metadata.name}", path=str(path)),
                )
            except ApiException as e:
                if e.status != 409:
                    raise
        for pv in pvs.values():
            ann = pv.metadata.annotations or {}
            if ann.get(PROVISIONED_BY) == PROVISIONER and pv.status.phase == "Released":
                try:
                    self.core.delete_persistent_volume(pv.metadata.name)
                except ApiException as e:
                    if e.status != 404:
                        raise
                if pv.spec.host_path and pv.spec.host_path.path.startswith(str(self.ctx.paths.volumes)):
                    shutil.rmtree(pv.spec.host_path.path, ignore_errors=True)
                log.info("volume deleted", extra=fields(pv=pv.metadata.name))

    def run(self) -> None:
        while not self.ctx.stopping.is_set():
            try:
                self.once()
            except Exception as e:
                log.warning("provisioner pass failed", extra=fields(error=str(e)))
            self.ctx.stopping.wait(self.interval_s)
