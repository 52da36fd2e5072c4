"""Node profiles: which emulated nodes exist, and pure functions from a profile to what the cluster
sees (GFD labels, capacity/allocatable, the Node object) and to the node's emulated GPU file.
"""

from __future__ import annotations

import json
import uuid
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trtforge.contract import gpu as g
from trtforge.contract.gpu_probe import EmulatedGPUFile, GPUDevice

EMULATED_LABEL = "trtforge.io/emulated-node"
DRIVER_VERSION = "580.159.04"
CUDA_DRIVER = ("13", "0", "0")
KUBELET_VERSION = "v1.20.2"
_FAMILY = {(9, 0): "hopper", (10, 0): "blackwell"}


class ProfileError(ValueError):
    pass


class MigSpec(BaseModel):
    """MIG instances per physical GPU, e.g. ``[{"3g.90gb": 2, "1g.23gb": 1}]``, exposed as the GPU
    Operator's `strategy` does: `mixed` (a resource per profile) or `single` (one profile on every
    GPU, each instance a `nvidia.com/gpu`, the product label `<product>-MIG-<profile>`)."""

    model_config = ConfigDict(extra="forbid")
    strategy: Literal["mixed", "single"] = "mixed"
    config: str = "all-balanced"
    layout: list[dict[str, int]] = Field(min_length=1)

    @model_validator(mode="after")
    def _single_is_one_profile(self) -> MigSpec:
        profiles = {p for per_gpu in self.layout for p in per_gpu}
        if self.strategy == "single" and len(profiles) != 1:
            raise ValueError(f"mig.strategy single slices every GPU alike; the layout has {sorted(profiles)}")
        return self

    @property
    def single(self) -> bool:
        return self.strategy == "single"


class NodeProfile(BaseModel):
    """One emulated node. `product` unset means a CPU-only node."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    product: str | None = None
    gpus: int = Field(default=0, ge=0)
    mig: MigSpec | None = None
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110
    arch: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    # Node taints, e.g. [{key: nvidia.com/gpu, effect: NoSchedule}] as GPU node pools carry.
    taints: list[dict[str, str]] = Field(default_factory=list)

    @property
    def mig_single(self) -> bool:
        return self.mig is not None and self.mig.single

    @field_validator("product")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        if v is not None and v not in g.KNOWN_GPUS:
            raise ValueError(f"unknown GPU product {v!r}; expected one of {', '.join(g.KNOWN_GPUS)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> NodeProfile:
        if self.product is None and (self.gpus or self.mig):
            raise ValueError("gpus/mig need a product")
        if self.product is not None and self.gpus < 1:
            raise ValueError("a GPU node needs gpus >= 1")
        if self.mig is not None:
            known = g.KNOWN_GPUS[self.product or ""]
            if len(self.mig.layout) != self.gpus:
                raise ValueError(f"mig.layout has {len(self.mig.layout)} entries for {self.gpus} GPUs")
            for per_gpu in self.mig.layout:
                for prof in per_gpu:
                    if prof not in known.mig_profiles:
                        raise ValueError(
                            f"MIG profile {prof!r} does not exist on {self.product}; expected "
                            f"one of {', '.join(known.mig_profiles)}"
                        )
                if sum(int(p.split("g.")[0]) * n for p, n in per_gpu.items()) > 7:
                    raise ValueError(f"MIG layout {per_gpu} uses more than 7 slices of one GPU")
        return self

    @property
    def node_arch(self) -> str:
        if self.arch:
            return self.arch
        return g.KNOWN_GPUS[self.product].arch if self.product else "amd64"


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[NodeProfile] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Profile:
        names = [n.name for n in self.nodes]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"node names repeat: {', '.join(sorted(dup))}")
        return self

    def node(self, name: str) -> NodeProfile:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ProfileError(f"no emulated node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")


# What `set_mig` (the emulated MIG manager) left on a node: its MigSpec as JSON, in the node's directory.
MIG_OVERRIDE_FILE = "mig.json"


def effective_node(p: NodeProfile, node_dir: Path) -> NodeProfile:
    """The node as its MIG manager left it: `p`, or `p` with the MIG layout set on the running test bed."""
    f = node_dir / MIG_OVERRIDE_FILE
    if not f.is_file():
        return p
    return NodeProfile.model_validate({**p.model_dump(), "mig": json.loads(f.read_text())})


def load_profile(path: Path | None = None) -> Profile:
    """The profile at `path`, or the packaged default. Errors name the file and the field."""
    if path is None:
        text = resources.files("trtforge_dev.testbed").joinpath("nodes.yaml").read_text()
        where = "the default node profile"
    else:
        try:
            text = path.read_text()
        except OSError as e:
            raise ProfileError(f"node profile {path}: cannot read it ({e})") from e
        where = f"node profile {path}"
    try:
        return Profile.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as e:
        raise ProfileError(f"{where} is not valid YAML: {e}") from e
    except ValidationError as e:
        errs = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ProfileError(f"{where} is invalid: {errs}") from e


def nvml_name(product: str) -> str:
    """The NVML device name whose GFD label is `product` (`NVIDIA-B200` -> `NVIDIA B200`)."""
    return product.replace("-", " ")


def _uuid(node: str, kind: str, *parts: object) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(["trtforge-testbed", node, kind, *map(str, parts)])))


def mig_memory_mib(product: str, profile: str) -> int:
    """The memory of a MIG profile: the known-GPU table's NVML figure where it has one (the same
    figures as a real GPU), else the nominal size in its name (`3g.90gb` -> 92160)."""
    facts = g.KNOWN_GPUS[product].mig.get(profile)
    if facts is not None and facts.memory_mib:
        return facts.memory_mib
    return int(profile.split(".")[1].removesuffix("gb")) * 1024


def mig_sm_count(product: str, profile: str) -> int:
    """SMs of a MIG profile as the known-GPU table has them from NVML; 0 (unknown) where it has none."""
    facts = g.KNOWN_GPUS[product].mig.get(profile)
    return (facts.sm_count or 0) if facts is not None else 0


def gpu_file(p: NodeProfile) -> EmulatedGPUFile:
    """The node's emulated devices: whole GPUs, or MIG instances for a MIG node (all healthy)."""
    devices: list[GPUDevice] = []
    if p.product is not None:
        known = g.KNOWN_GPUS[p.product]
        cc = f"{known.compute_capability[0]}.{known.compute_capability[1]}"
        name = nvml_name(p.product)
        for i in range(p.gpus):
            if p.mig is None:
                devices.append(
                    GPUDevice(
                        index=i,
                        uuid=f"GPU-{_uuid(p.name, 'gpu', i)}",
                        name=name,
                        memory_mib=known.memory_mib,
                        compute_capability=cc,
                        sm_count=known.sm_count,
                        driver_version=DRIVER_VERSION,
                    )
                )
                continue
            n = 0
            for prof, count in sorted(p.mig.layout[i].items()):
                for _ in range(count):
                    devices.append(
                        GPUDevice(
                            index=i,
                            uuid=f"MIG-{_uuid(p.name, 'mig', i, n)}",
                            name=f"{name} MIG {prof}",
                            memory_mib=mig_memory_mib(p.product, prof),
                            compute_capability=cc,
                            mig_profile=prof,
                            sm_count=mig_sm_count(p.product, prof),
                            driver_version=DRIVER_VERSION,
                        )
                    )
                    n += 1
    return EmulatedGPUFile(node=p.name, arch=p.node_arch, devices=devices)


def resource_of(d: GPUDevice, single: bool = False) -> str:
    """The extended resource a device is advertised as: a MIG instance is `nvidia.com/mig-<profile>`
    under the mixed strategy and `nvidia.com/gpu` under single."""
    if d.mig_profile and not single:
        return f"nvidia.com/mig-{g.mig_resource_suffix(d.mig_profile)}"
    return g.RESOURCE_GPU


def gpu_resources(f: EmulatedGPUFile, healthy_only: bool, single: bool = False) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in f.devices:
        out.setdefault(resource_of(d, single), 0)
        if d.healthy or not healthy_only:
            out[resource_of(d, single)] += 1
    return out


def node_labels(p: NodeProfile) -> dict[str, str]:
    """Kubernetes well-known labels plus GPU Feature Discovery labels (docs/design.md §"GPU labels")."""
    arch = p.node_arch
    labels = {
        "kubernetes.io/hostname": p.name,
        "kubernetes.io/os": "linux",
        g.LABEL_ARCH: arch,
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": arch,
        EMULATED_LABEL: "true",
    }
    if p.product is not None:
        known = g.KNOWN_GPUS[p.product]
        labels.update(
            {
                "nvidia.com/gpu.present": "true",
                g.LABEL_PRODUCT: p.product,
                g.LABEL_CC_MAJOR: str(known.compute_capability[0]),
                g.LABEL_CC_MINOR: str(known.compute_capability[1]),
                g.LABEL_MEMORY: str(known.memory_mib),
                g.LABEL_COUNT: str(p.gpus),
                "nvidia.com/gpu.family": _FAMILY.get(known.compute_capability, "unknown"),
                "nvidia.com/cuda.driver.major": CUDA_DRIVER[0],
                "nvidia.com/cuda.driver.minor": CUDA_DRIVER[1],
                "nvidia.com/cuda.driver.rev": CUDA_DRIVER[2],
                g.LABEL_MIG_CAPABLE: "true" if known.mig_profiles else "false",
                g.LABEL_MIG_STRATEGY: p.mig.strategy if p.mig else "none",
                g.LABEL_MIG_CONFIG: p.mig.config if p.mig else "all-disabled",
            }
        )
        if p.mig is not None and p.mig.single:
            # GFD under the single strategy: the slice is the product, counted as GPUs.
            (prof,) = {q for per_gpu in p.mig.layout for q in per_gpu}
            labels[g.LABEL_MIG_CONFIG_STATE] = "success"
            labels[g.LABEL_PRODUCT] = g.GPUTarget(gpu=p.product, mig=prof).single_strategy_product()
            labels[g.LABEL_COUNT] = str(sum(n for per_gpu in p.mig.layout for n in per_gpu.values()))
            labels[g.LABEL_MEMORY] = str(mig_memory_mib(p.product, prof))
        elif p.mig is not None:
            labels[g.LABEL_MIG_CONFIG_STATE] = "success"
            totals: dict[str, int] = {}
            for per_gpu in p.mig.layout:
                for prof, n in per_gpu.items():
                    totals[prof] = totals.get(prof, 0) + n
            for prof, n in totals.items():
                res = g.mig_resource_suffix(prof)  # as the device plugin and GFD spell it
                labels[f"nvidia.com/mig-{res}.count"] = str(n)
                labels[f"nvidia.com/mig-{res}.memory"] = str(mig_memory_mib(p.product, prof))
                if mig_sm_count(p.product, prof):
                    labels[f"nvidia.com/mig-{res}.multiprocessors"] = str(mig_sm_count(p.product, prof))
                labels[f"nvidia.com/mig-{res}.product"] = f"{p.product}-MIG-{res}"
    labels.update(p.labels)
    return labels


def capacity(p: NodeProfile, f: EmulatedGPUFile, healthy_only: bool) -> dict[str, str]:
    out = {"cpu": p.cpu, "memory": p.memory, "pods": str(p.pods), "ephemeral-storage": "100Gi"}
    out.update({k: str(v) for k, v in gpu_resources(f, healthy_only, p.mig_single).items()})
    return out


def ready_condition(
    ready: bool,
    now: str,
    reason: str = "KubeletReady",
    message: str = "emulated kubelet is posting ready status",
) -> dict[str, Any]:
    return {
        "type": "Ready",
        "status": "True" if ready else "Unknown",
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def node_status(p: NodeProfile, f: EmulatedGPUFile, now: str, kubelet_port: int = 0) -> dict[str, Any]:
    """Status for a healthy, heartbeating node: capacity counts every device, allocatable the healthy ones."""
    conds = [
        {
            "type": t,
            "status": "False",
            "reason": r,
            "message": "emulated",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        for t, r in (
            ("MemoryPressure", "KubeletHasSufficientMemory"),
            ("DiskPressure", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "KubeletHasSufficientPID"),
            ("NetworkUnavailable", "RouteCreated"),
        )
    ]
    conds.append(ready_condition(True, now))
    return {
        "capacity": capacity(p, f, healthy_only=False),
        "allocatable": capacity(p, f, healthy_only=True),
        "conditions": conds,
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": p.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "machineID": _uuid(p.name, "machine").replace("-", ""),
            "systemUUID": _uuid(p.name, "system"),
            "bootID": _uuid(p.name, "boot"),
            "kernelVersion": "emulated",
            "osImage": "trtforge emulated node",
            "containerRuntimeVersion": "trtforge-emulated://0.1",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": p.node_arch,
        },
    }


def node_object(p: NodeProfile) -> dict[str, Any]:
    """The Node to create (status is written separately through the status subresource)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": p.name, "labels": node_labels(p)},
        "spec": {"taints": [dict(t) for t in p.taints]} if p.taints else {},
    }
