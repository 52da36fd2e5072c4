"""Fault injection on the running test bed: GPU Xids, heal, node down/up; MIG reconfiguration.

A fault rewrites the node's GPU file (the probe sees the Xid; the device turns unhealthy on a
critical Xid) and updates the Node's allocatable right away, as the device plugin would.
"""

from __future__ import annotations

import time
from typing import Any

from trtforge.contract.gpu_probe import EmulatedGPUFile, GPUDevice
from trtforge_dev.testbed import gpus
from trtforge_dev.testbed.controlplane import ClusterError, ClusterState, is_up
from trtforge_dev.testbed.paths import StatePaths
from trtforge_dev.testbed.profile import (
    MIG_OVERRIDE_FILE,
    MigSpec,
    NodeProfile,
    Profile,
    effective_node,
    gpu_file,
    node_labels,
)


def _profile(paths: StatePaths) -> Profile:
    if not is_up(paths):
        raise ClusterError(f"the test bed at {paths.root} is not up: `trtforge cluster up` first")
    f = paths.profile_file
    if not f.is_file():
        raise ClusterError(f"{f} is missing: is the emulated kubelet running? see {paths.logs}/kubelet.log")
    return Profile.model_validate_json(f.read_text())


def _sync(paths: StatePaths, profile: Profile, node: str, f: EmulatedGPUFile | None) -> None:
    from trtforge_dev.testbed.kube import api_client
    from trtforge_dev.testbed.kubelet.node import sync_node_status

    with api_client(paths.kubeconfig) as api:
        st = ClusterState.load(paths)
        p = effective_node(profile.node(node), paths.node_dir(node))
        sync_node_status(api, p, f, st.kubelet_port if st else 0)


def set_mig(paths: StatePaths, node: str, mig: MigSpec | None) -> None:
    """What the GPU Operator's MIG manager and GFD do when a node's MIG config changes: new MIG
    instances in the node's GPU file, its GFD labels for `mig.strategy` (None: back to the profile's
    own layout), and its resources. The node must have no GPU pods."""
    from kubernetes import client

    from trtforge_dev.testbed.kube import api_client

    profile = _profile(paths)
    base = profile.node(node)
    if base.product is None:
        raise gpus.GPUError(f"node {node} has no GPUs")
    override = paths.node_dir(node) / MIG_OVERRIDE_FILE
    before = node_labels(effective_node(base, paths.node_dir(node)))
    if mig is None:
        override.unlink(missing_ok=True)
    else:
        NodeProfile.model_validate({**base.model_dump(), "mig": mig.model_dump()})  # refused here if bad
        override.write_text(mig.model_dump_json())
    p = effective_node(base, paths.node_dir(node))
    new = gpu_file(p)
    new.write(paths.gpu_file(node))
    labels: dict[str, str | None] = {k: None for k in before}
    labels.update(node_labels(p))
    with api_client(paths.kubeconfig) as api:
        client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": labels}})
    _sync(paths, profile, node, new)


def fault(paths: StatePaths, node: str, gpu: int | None = None, xid: int = 79) -> GPUDevice:
    """Inject Xid `xid` into device `gpu` of `node`; returns the device after the fault."""
    profile = _profile(paths)
    p = profile.node(node)
    if p.product is None:
        raise gpus.GPUError(f"node {node} has no GPUs")
    hit: list[GPUDevice] = []

    def apply(f: EmulatedGPUFile) -> EmulatedGPUFile:
        new, dev = gpus.with_fault(f, gpu, xid, time.time())
        hit.append(dev)
        return new

    new = gpus.update(paths.gpu_file(node), apply)
    _sync(paths, profile, node, new)
    return hit[0]


def heal(paths: StatePaths, node: str) -> None:
    """Every GPU of `node` healthy again; a downed node comes back up."""
    profile = _profile(paths)
    p = profile.node(node)
    paths.node_down_flag(node).unlink(missing_ok=True)
    if p.product is not None:
        new = gpus.update(paths.gpu_file(node), gpus.healed)
        _sync(paths, profile, node, new)


def node_down(paths: StatePaths, node: str, timeout_s: float = 30.0) -> None:
    """Stop the node's heartbeats and pods; returns once the kubelet has done it."""
    _profile(paths).node(node)
    flag = paths.node_down_flag(node)
    flag.parent.mkdir(parents=True, exist_ok=True)
    flag.write_text(str(time.time()))
    _wait_node_ready(paths, node, want=False, timeout_s=timeout_s)


def node_up(paths: StatePaths, node: str, timeout_s: float = 30.0) -> None:
    _profile(paths).node(node)
    paths.node_down_flag(node).unlink(missing_ok=True)
    _wait_node_ready(paths, node, want=True, timeout_s=timeout_s)


def _wait_node_ready(paths: StatePaths, node: str, want: bool, timeout_s: float) -> None:
    from kubernetes import client

    from trtforge_dev.testbed.kube import api_client
    from trtforge_dev.testbed.wait import wait_for

    with api_client(paths.kubeconfig) as api:
        core: Any = client.CoreV1Api(api)

        def ready() -> bool | None:
            n = core.read_node(node)
            conds = {c.type: c.status for c in n.status.conditions or []}
            return (conds.get("Ready") == "True") == want or None

        wait_for(ready, timeout=timeout_s, interval=0.2, desc=f"node {node} Ready={want}")
