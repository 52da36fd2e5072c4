"""Pure pieces of running a pod: environment variables, `$(VAR)` expansion, field references,
and the pod phase/conditions that follow from container states (as the kubelet computes them).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

_VAR_RE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion: defined names are replaced, `$$` is a literal `$`, others stay."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR_RE.sub(sub, value)


class ConfigError(RuntimeError):
    """A container's configuration cannot be resolved yet (CreateContainerConfigError)."""


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str) -> str:
    """The value of a downward-API `fieldRef.fieldPath` for this pod."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m[1]) or {}).get(m[2], ""))
    simple: dict[str, str] = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": "127.0.0.1",
    }
    if path == "metadata.labels":
        return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("labels") or {}).items()))
    if path == "metadata.annotations":
        return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("annotations") or {}).items()))
    if path not in simple:
        raise ConfigError(f"fieldRef {path!r} is not supported")
    return simple[path]


# ("secret" | "configmap", name, optional) -> its data; None when it is absent and optional.
Lookup = Callable[[str, str, bool], dict[str, str] | None]


def _key_value(lookup: Lookup, namespace: str, kind: str, ref: Mapping[str, Any]) -> str | None:
    """A secretKeyRef / configMapKeyRef: the key's value; None when it is optional and missing."""
    optional = bool(ref.get("optional"))
    data = lookup(kind, ref["name"], optional)
    if data is None:
        return None
    if ref["key"] not in data:
        if optional:
            return None
        raise ConfigError(f"couldn't find key {ref['key']} in {kind} {namespace}/{ref['name']}")
    return data[ref["key"]]


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    base: Mapping[str, str],
    pod_ip: str,
    lookup: Lookup,
) -> dict[str, str]:
    """`base`, then envFrom, then env in order with `$(VAR)` expansion, as the kubelet builds it."""
    env = dict(base)
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        if "configMapRef" in src:
            ref = src["configMapRef"]
            data = lookup("configmap", ref["name"], bool(ref.get("optional")))
        elif "secretRef" in src:
            ref = src["secretRef"]
            data = lookup("secret", ref["name"], bool(ref.get("optional")))
        else:
            continue
        for k, v in (data or {}).items():
            env[prefix + k] = v
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(item.get("value", ""), env)
            continue
        vf = item["valueFrom"]
        value: str | None
        if "fieldRef" in vf:
            value = field_value(pod, vf["fieldRef"]["fieldPath"], pod_ip)
        elif "secretKeyRef" in vf:
            value = _key_value(lookup, namespace, "secret", vf["secretKeyRef"])
        elif "configMapKeyRef" in vf:
            value = _key_value(lookup, namespace, "configmap", vf["configMapKeyRef"])
        elif "resourceFieldRef" in vf:
            value = _resource_value(container, vf["resourceFieldRef"])
        else:
            raise ConfigError(f"env {name}: unsupported valueFrom {sorted(vf)}")
        if value is not None:
            env[name] = value
    return env


BACKEND_VERSION_ENV = "TRTFORGE_TESTBED_BACKEND_VERSION"
IMAGE_SHIM = Path(__file__).with_name("image_shim")


def image_stand_in(env: Mapping[str, str], shim: Path = IMAGE_SHIM) -> dict[str, str]:
    """The test bed ignores images; a container env with ``TRTFORGE_TESTBED_BACKEND_VERSION`` stands in
    for an image carrying another backend build: its Python loads the shim (image_shim/sitecustomize.py),
    which makes ONNX Runtime report that version."""
    out = dict(env)
    if out.get(BACKEND_VERSION_ENV):
        prev = out.get("PYTHONPATH")
        out["PYTHONPATH"] = f"{shim}:{prev}" if prev else str(shim)
    return out


def _resource_value(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    kind, _, res = str(ref.get("resource", "")).partition(".")
    resources = container.get("resources") or {}
    v = (resources.get(kind) or {}).get(res)
    return str(v) if v is not None else "0"


def command_line(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expansion. The image is ignored, so a container needs a command."""
    cmd = list(container.get("command") or [])
    args = list(container.get("args") or [])
    argv = [expand(a, env) for a in cmd + args]
    if not argv:
        raise ConfigError(
            f"container {container.get('name')!r} has no command: the emulated kubelet "
            "ignores images (there is no entrypoint), so give `command`"
        )
    return argv


def will_restart(policy: str, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def pod_phase(policy: str, init_done: bool, init_failed: bool, states: list[tuple[str, int | None]]) -> str:
    """The pod phase from the containers' states: ("waiting"|"running"|"terminated", exit code).

    A terminated container that will be restarted counts as not finished.
    """
    if init_failed:
        return "Failed"
    if not init_done:
        return "Pending"
    if any(s == "running" for s, _ in states):
        return "Running"
    if states and all(s == "terminated" for s, _ in states):
        codes = [c or 0 for _, c in states]
        if any(will_restart(policy, c) for c in codes):
            return "Running"
        return "Succeeded" if all(c == 0 for c in codes) else "Failed"
    if any(s == "terminated" for s, _ in states):
        return "Running"
    return "Pending"


def pod_ip_for(n: int, block: int = 1) -> str:
    """The n-th pod address (n >= 0) of address block `block` (1..254): 127.<block>.0.1,
    127.<block>.0.2, … skipping .0 and .255. One block holds 65024 pods."""
    per_c = 254
    if not 1 <= block <= 254:
        raise ValueError(f"pod address block must be 1..254, got {block}")
    if n >= per_c * 256:
        raise ValueError(f"out of pod addresses in block 127.{block}.0.0/16")
    c = n % per_c + 1
    b = n // per_c
    return f"127.{block}.{b}.{c}"


POD_BLOCK_ENV = "TRTFORGE_POD_BLOCK"


def pod_block(root: str, env: Mapping[str, str] = os.environ) -> int:
    """The pod address block of the test bed at `root`: ``$TRTFORGE_POD_BLOCK`` (1-254) where set,
    which is how the test suite gives each of its test beds a block of its own, else
    :func:`pod_block_for` the path."""
    raw = env.get(POD_BLOCK_ENV, "")
    if not raw:
        return pod_block_for(root)
    if not raw.isdigit() or not 1 <= int(raw) <= 254:
        raise ValueError(f"{POD_BLOCK_ENV}={raw!r}: expected a number from 1 to 254 (the x of 127.x.0.0/16)")
    return int(raw)


def pod_block_for(root: str) -> int:
    """The pod address block of the test bed whose state lives at `root`: derived from the path, so
    two test beds on one machine (two checkouts) almost never hand out the same pod address."""
    digest = hashlib.sha256(root.encode()).digest()
    return 1 + int.from_bytes(digest[:4], "big") % 254
