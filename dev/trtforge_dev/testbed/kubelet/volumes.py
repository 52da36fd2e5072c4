"""Materialise a pod's volumes as host directories, and the bind mounts each container needs.

emptyDir → a fresh directory; configMap/secret/downwardAPI/projected → files written by the kubelet
(service-account tokens through the TokenRequest API); persistentVolumeClaim → the bound PV's
hostPath directory; hostPath → itself. Not ready yet (e.g. PVC unbound) raises :class:`NotReady`.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from trtforge_dev.testbed.kubelet.podspec import field_value


class NotReady(RuntimeError):
    """A volume cannot be set up yet; the message says why (shown as the waiting reason)."""


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool


def _write_files(d: Path, files: dict[str, bytes], mode: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        os.replace(tmp, p)


def _select(data: dict[str, bytes], items: list[dict[str, Any]] | None, what: str) -> dict[str, bytes]:
    if not items:
        return data
    out = {}
    for it in items:
        if it["key"] not in data:
            raise NotReady(f"{what} has no key {it['key']!r}")
        out[it["path"]] = data[it["key"]]
    return out


def _default_mode(volume: dict[str, Any]) -> int:
    for k, src in volume.items():
        if k != "name" and isinstance(src, dict) and src.get("defaultMode") is not None:
            return int(src["defaultMode"])
    return 0o644


class VolumeBuilder:
    """Builds the volumes of one pod under `pod_dir/volumes`."""

    def __init__(self, api: client.ApiClient, pod: dict[str, Any], pod_dir: Path, pod_ip: str) -> None:
        self.core: Any = client.CoreV1Api(api)
        self.pod = pod
        self.ns = pod["metadata"]["namespace"]
        self.dir = pod_dir / "volumes"
        self.pod_ip = pod_ip

    def _data(self, kind: str, name: str, optional: bool) -> dict[str, bytes] | None:
        """A configmap's or secret's data as bytes; None when it is missing and optional."""
        try:
            if kind == "secret":
                obj = self.core.read_namespaced_secret(name, self.ns)
            else:
                obj = self.core.read_namespaced_config_map(name, self.ns)
        except ApiException as e:
            if e.status == 404:
                if optional:
                    return None
                raise NotReady(f'{kind} "{name}" not found') from e
            raise
        if kind == "secret":
            return {k: base64.b64decode(v) for k, v in (obj.data or {}).items()}
        out = {k: v.encode() for k, v in (obj.data or {}).items()}
        out.update({k: base64.b64decode(v) for k, v in (obj.binary_data or {}).items()})
        return out

    def _files(self, kind: str, name: str, src: dict[str, Any]) -> dict[str, bytes]:
        """The files a configMap or secret source (volume or projection) asks for (`items`, `optional`)."""
        data = self._data(kind, name, bool(src.get("optional"))) or {}
        return _select(data, src.get("items"), f'{kind} "{name}"')

    def _token(self, audience: str | None, seconds: int | None) -> bytes:
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        meta = self.pod["metadata"]
        spec: dict[str, Any] = {
            "expirationSeconds": seconds or 3607,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
        }
        if audience:
            spec["audiences"] = [audience]
        try:
            tr = self.core.create_namespaced_service_account_token(
                sa, self.ns, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
            )
        except ApiException as e:
            if e.status == 404:
                raise NotReady(f'serviceaccount "{sa}" not found') from e
            raise
        return str(tr.status.token).encode()

    def _downward(self, items: list[dict[str, Any]]) -> dict[str, bytes]:
        out = {}
        for it in items:
            if "fieldRef" in it:
                out[it["path"]] = field_value(self.pod, it["fieldRef"]["fieldPath"], self.pod_ip).encode()
        return out

    def _pvc(self, claim: str) -> Path:
        try:
            pvc = self.core.read_namespaced_persistent_volume_claim(claim, self.ns)
        except ApiException as e:
            if e.status == 404:
                raise NotReady(f'persistentvolumeclaim "{claim}" not found') from e
            raise
        if pvc.status.phase != "Bound" or not pvc.spec.volume_name:
            raise NotReady(f'persistentvolumeclaim "{claim}" is not bound')
        pv = self.core.read_persistent_volume(pvc.spec.volume_name)
        if pv.spec.host_path is None:
            raise NotReady(f"persistentvolume {pv.metadata.name} is not a hostPath/local directory volume")
        path = Path(pv.spec.host_path.path)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def build(self) -> dict[str, Path]:
        """Volume name -> host path, creating and filling them."""
        out: dict[str, Path] = {}
        for v in self.pod["spec"].get("volumes") or []:
            name = v["name"]
            d = self.dir / name
            mode = _default_mode(v)
            if "emptyDir" in v:
                d.mkdir(parents=True, exist_ok=True)
            elif "configMap" in v:
                src = v["configMap"]
                _write_files(d, self._files("configmap", src["name"], src), mode)
            elif "secret" in v:
                src = v["secret"]
                _write_files(d, self._files("secret", src["secretName"], src), mode)
            elif "downwardAPI" in v:
                _write_files(d, self._downward(v["downwardAPI"].get("items") or []), mode)
            elif "projected" in v:
                files: dict[str, bytes] = {}
                for s in v["projected"].get("sources") or []:
                    if "serviceAccountToken" in s:
                        t = s["serviceAccountToken"]
                        files[t["path"]] = self._token(t.get("audience"), t.get("expirationSeconds"))
                    elif "configMap" in s:
                        files.update(self._files("configmap", s["configMap"]["name"], s["configMap"]))
                    elif "secret" in s:
                        files.update(self._files("secret", s["secret"]["name"], s["secret"]))
                    elif "downwardAPI" in s:
                        files.update(self._downward(s["downwardAPI"].get("items") or []))
                _write_files(d, files, mode)
            elif "persistentVolumeClaim" in v:
                d = self._pvc(v["persistentVolumeClaim"]["claimName"])
            elif "hostPath" in v:
                d = Path(v["hostPath"]["path"])
                if v["hostPath"].get("type") in ("DirectoryOrCreate", None, ""):
                    d.mkdir(parents=True, exist_ok=True)
            else:
                kinds = sorted(k for k in v if k != "name")
                raise NotReady(f"volume {name!r}: type {kinds} is not supported by the emulated kubelet")
            out[name] = d
        return out


def container_mounts(container: dict[str, Any], volumes: dict[str, Path]) -> list[Mount]:
    """The bind mounts for a container's volumeMounts (subPath honoured), parents before children."""
    out = []
    for m in container.get("volumeMounts") or []:
        if m["name"] not in volumes:
            raise NotReady(f"volumeMount {m['mountPath']!r} names unknown volume {m['name']!r}")
        src = volumes[m["name"]]
        if m.get("subPath"):
            src = src / m["subPath"]
            if not src.exists():
                src.mkdir(parents=True, exist_ok=True)
        out.append(Mount(source=src, target=m["mountPath"], read_only=bool(m.get("readOnly"))))
    return sorted(out, key=lambda x: x.target.rstrip("/").count("/"))
