"""Emulated GPUs: allocation to pods and fault/heal, on a node's EmulatedGPUFile.

The functions on files are pure; :func:`update` applies one to the node's file atomically.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from trtforge.contract.gpu_probe import CRITICAL_XIDS, EmulatedGPUFile, GPUDevice, XidEvent
from trtforge_dev.testbed.profile import resource_of


class GPUError(ValueError):
    pass


class AllocationError(RuntimeError):
    pass


def gpu_requests(resources: dict[str, str] | None) -> dict[str, int]:
    """The nvidia.com/gpu and nvidia.com/mig-* amounts of a container's limits (or requests)."""
    out: dict[str, int] = {}
    for k, v in (resources or {}).items():
        if k == "nvidia.com/gpu" or k.startswith("nvidia.com/mig-"):
            out[k] = int(str(v))
    return out


def allocate(
    f: EmulatedGPUFile, wanted: dict[str, int], taken: set[str], single: bool = False
) -> list[GPUDevice]:
    """Pick healthy, free devices for `wanted` (resource -> count), as the device plugin would
    (`single`: the node's MIG instances are offered as nvidia.com/gpu)."""
    chosen: list[GPUDevice] = []
    for res, n in sorted(wanted.items()):
        free = [d for d in f.devices if resource_of(d, single) == res and d.healthy and d.uuid not in taken]
        if len(free) < n:
            raise AllocationError(f"node {f.node} has {len(free)} free healthy {res}, the pod asks for {n}")
        chosen.extend(free[:n])
    return chosen


def with_fault(
    f: EmulatedGPUFile, gpu: int | None, xid: int, now: float, message: str = ""
) -> tuple[EmulatedGPUFile, GPUDevice]:
    """`f` with an Xid event on device number `gpu` (its position in the file; default: the first
    healthy device). A critical Xid (docs/design.md §"GPU faults") also marks the device
    unhealthy."""
    if not f.devices:
        raise GPUError(f"node {f.node} has no GPUs to fault")
    if gpu is None:
        healthy = [i for i, d in enumerate(f.devices) if d.healthy]
        gpu = healthy[0] if healthy else 0
    if not 0 <= gpu < len(f.devices):
        raise GPUError(f"--gpu {gpu} is out of range: node {f.node} has devices 0..{len(f.devices) - 1}")
    devices = [d.model_copy(deep=True) for d in f.devices]
    d = devices[gpu]
    d.xid_events.append(
        XidEvent(
            xid=xid,
            gpu_uuid=d.uuid,
            time=now,
            message=message or f"emulated Xid {xid} injected by the test bed",
        )
    )
    if xid in CRITICAL_XIDS:
        d.healthy = False
    return f.model_copy(update={"devices": devices}), d


def healed(f: EmulatedGPUFile) -> EmulatedGPUFile:
    """Every device healthy again (the Xid history stays)."""
    devices = [d.model_copy(update={"healthy": True}) for d in f.devices]
    return f.model_copy(update={"devices": devices})


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.with_name(f".{path.name}.lock")
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def update(path: Path, fn: Callable[[EmulatedGPUFile], EmulatedGPUFile]) -> EmulatedGPUFile:
    """Read-modify-write the node's GPU file under a lock; readers always see a whole file."""
    if not path.is_file():
        raise GPUError(f"{path} does not exist: is the test bed up, and is that node a GPU node?")
    with _locked(path):
        new = fn(EmulatedGPUFile.read(path))
        new.write(path)
    return new
