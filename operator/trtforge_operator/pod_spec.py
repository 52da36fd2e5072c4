"""A pod spec as compared for trust: what runs (image, command, args, env, mounts, volumes), with the
apiserver's defaults and empty values dropped. Pure. The broker matches a verify pod against the
operator's rendering with it (broker/pod_match.py); the fault loop matches a runtime pod against its
ReplicaSet's template (planning/fault_trust.py), since a ReplicaSet adopts any pod its selector
matches, a tenant's own included."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from trtforge.contract.quantity import QuantityError, parse_quantity

DEFAULT_MODE = 420  # what the apiserver sets on secret, configMap and projected volumes
QUANTITY_KEYS = frozenset({"sizeLimit", "divisor"})
CONTAINER_FIELDS = (
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "env",
    "envFrom",
    "volumeMounts",
    "volumeDevices",
)


def normalized(value: Any, key: str = "") -> Any:
    """A field as compared: empty and false values and apiserver defaults dropped, quantities parsed."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            n = normalized(v, str(k))
            if (
                n in (None, "", [], {}, False)
                or (k == "defaultMode" and n == DEFAULT_MODE)
                or (key == "fieldRef" and k == "apiVersion" and n == "v1")  # the apiserver's default
            ):
                continue
            out[str(k)] = n
        return out
    if isinstance(value, list | tuple):
        return [normalized(v) for v in value]
    if key in QUANTITY_KEYS and isinstance(value, str | int | float):
        try:
            return str(parse_quantity(value).normalize())
        except QuantityError:
            return value
    return value


def fingerprint(spec: Mapping[str, Any]) -> str:
    """A digest of what a pod spec runs: its containers' (and init containers') image, command, args,
    working directory, env and mounts, and its volumes."""

    def containers(key: str) -> list[Any]:
        return [{f: c.get(f) for f in CONTAINER_FIELDS} for c in spec.get(key) or []]

    doc = normalized(
        {
            "containers": containers("containers"),
            "initContainers": containers("initContainers"),
            "ephemeralContainers": containers("ephemeralContainers"),
            "volumes": spec.get("volumes") or [],
        }
    )
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
