"""kubernetes-sigs/lws's LeaderWorkerSet CRD on the test bed (manifests/lws-leaderworkersets-crd.SOURCE),
installed as published, with the one adaptation Kubernetes 1.20 needs (see `install`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import yaml
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.wait import wait_for
from trtforge_operator.apply import lws

CRD = Path(__file__).parent / "manifests" / "lws-leaderworkersets-crd.yaml.gz"
_EMPTY_DEFAULT = '.default: Invalid value: "null":  in body must be of type string: "null"'


def install(testbed: TestBed) -> None:
    testbed.kubectl("delete", "crd", lws.CRD_NAME, "--ignore-not-found", "--wait=true")
    # `create`, not `apply`: the CRD (1.3 MB) is far over the last-applied annotation's 256 KiB.
    text = gzip.decompress(CRD.read_bytes()).decode()
    made = testbed.kubectl("create", "-f", "-", input=text, check=False)
    if made.returncode != 0:
        # Kubernetes 1.20 refuses a schema default of "" (it reads it as null: 'default: Invalid value:
        # "null": in body must be of type string'); controller-gen writes 66 of them, all on the names
        # of object references inside the pod templates. The one adaptation, made only where the
        # apiserver refuses the CRD for that reason alone: those defaults go, and where such a name
        # keys a list map (imagePullSecrets) it becomes required, as 1.20 asks of list-map keys.
        errors = [line for line in made.stderr.splitlines() if line.startswith("* spec.validation")]
        assert errors and all(_EMPTY_DEFAULT in line for line in errors), made.stderr[-3000:]
        crd = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        assert drop_empty_defaults(crd) == 66
        made = testbed.kubectl("create", "-f", "-", input=json.dumps(crd), check=False)
    assert made.returncode == 0, made.stderr[-3000:]
    # Polled, not `kubectl wait`: 1.20's kubectl fails at once while the CRD has no conditions yet.
    wait_for(lambda: established(testbed), timeout=300, desc=f"CRD {lws.CRD_NAME} Established")


def remove(testbed: TestBed) -> None:
    testbed.kubectl("delete", "crd", lws.CRD_NAME, "--ignore-not-found", "--wait=false")


def established(testbed: TestBed) -> bool:
    got = testbed.kubectl("get", "crd", lws.CRD_NAME, "-o", "json", check=False)
    conds = (
        (json.loads(got.stdout).get("status") or {}).get("conditions") or [] if got.returncode == 0 else []
    )
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)


def drop_empty_defaults(node: Any) -> int:
    """Remove every `default: ""` under `node`; a list-map key that loses one becomes required."""
    n = 0
    if isinstance(node, dict):
        items = node.get("items")
        if isinstance(items, dict):
            for key in node.get("x-kubernetes-list-map-keys", ()):
                if (items.get("properties") or {}).get(key, {}).get("default") == "":
                    items["required"] = sorted({*items.get("required", ()), key})
        if node.get("default") == "" and node.get("type") == "string":
            del node["default"]
            n += 1
        return n + sum(drop_empty_defaults(v) for v in node.values())
    if isinstance(node, list):
        return sum(drop_empty_defaults(v) for v in node)
    return 0
