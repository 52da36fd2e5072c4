"""GPU targets and identities: what an engine is built for and what a node or probe reports.

A *target* is what a user asks for (`{gpu: <nvidia.com/gpu.product>, mig: <profile>}`); an *identity*
is the full set of facts about that GPU that decide an engine (compute capability, SM count, MIG
slice, CPU architecture). The operator derives identities from Node labels (GPU Feature Discovery);
the builder and runtime derive them from the GPU probe. Both must agree, so both go through
:func:`identity_for_target`, which fills what labels and probes do not carry from one table.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CPU = "cpu"
FULL_GPU = "full"

# GPU Feature Discovery label keys (docs/design.md §4).
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_CC_MAJOR = "nvidia.com/gpu.compute.major"
LABEL_CC_MINOR = "nvidia.com/gpu.compute.minor"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_MIG_CAPABLE = "nvidia.com/mig.capable"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
LABEL_MIG_CONFIG = "nvidia.com/mig.config"
LABEL_MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
LABEL_ARCH = "kubernetes.io/arch"
RESOURCE_GPU = "nvidia.com/gpu"

MIG_PROFILE_RE = re.compile(r"^[1-7]g\.[0-9]+gb$")


class KnownGPU(BaseModel):
    """Facts about a GPU product that labels do not carry."""

    model_config = ConfigDict(frozen=True)
    compute_capability: tuple[int, int]
    sm_count: int
    memory_mib: int
    arch: Literal["amd64", "arm64"]
    # MIG profile -> SMs in that slice.
    mig_profiles: dict[str, int] = Field(default_factory=dict)


def _mig(profiles: list[str], sms_per_g: int, full_sms: int) -> dict[str, int]:
    out = {}
    for p in profiles:
        g = int(p.split("g.", 1)[0])
        out[p] = full_sms if g == 7 else g * sms_per_g
    return out


# Keyed by the GFD `nvidia.com/gpu.product` value (spaces of the NVML name become dashes).
KNOWN_GPUS: dict[str, KnownGPU] = {
    "NVIDIA-H100-80GB-HBM3": KnownGPU(
        compute_capability=(9, 0),
        sm_count=132,
        memory_mib=81559,
        arch="amd64",
        mig_profiles=_mig(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"], 16, 132),
    ),
    "NVIDIA-H200": KnownGPU(
        compute_capability=(9, 0),
        sm_count=132,
        memory_mib=143771,
        arch="amd64",
        mig_profiles=_mig(["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"], 16, 132),
    ),
    "NVIDIA-GH200-480GB": KnownGPU(
        compute_capability=(9, 0),
        sm_count=132,
        memory_mib=97871,
        arch="arm64",
        mig_profiles=_mig(["1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"], 16, 132),
    ),
    "NVIDIA-B200": KnownGPU(
        compute_capability=(10, 0),
        sm_count=148,
        memory_mib=183359,
        arch="amd64",
        mig_profiles=_mig(["1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"], 18, 148),
    ),
}


def product_label(nvml_name: str) -> str:
    """The GFD label value for an NVML device name: `NVIDIA H100 80GB HBM3` -> `NVIDIA-H100-80GB-HBM3`."""
    return re.sub(r"\s+", "-", nvml_name.strip())


class GPUTarget(BaseModel):
    """What an engine is built for: a GPU product (or `cpu`) and optionally a MIG profile."""

    model_config = ConfigDict(frozen=True)
    gpu: str = Field(min_length=1)
    mig: str | None = None

    @field_validator("mig")
    @classmethod
    def _mig_profile(cls, v: str | None) -> str | None:
        if v is not None and not MIG_PROFILE_RE.match(v):
            raise ValueError(f"mig profile {v!r} is not like '1g.10gb' (<slices>g.<memory>gb)")
        return v

    @property
    def is_cpu(self) -> bool:
        return self.gpu == CPU

    @property
    def name(self) -> str:
        """A DNS-1123 label naming this target, stable and unique per (gpu, mig)."""
        base = "cpu" if self.is_cpu else self.gpu.lower().removeprefix("nvidia-")
        if self.mig:
            base = f"{base}-mig-{self.mig}"
        slug = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")
        if len(slug) > 40:
            digest = hashlib.sha256(slug.encode()).hexdigest()[:8]
            slug = f"{slug[:31].rstrip('-')}-{digest}"
        return slug

    def resource_name(self) -> str | None:
        """The extended resource a pod requests for one unit of this target (None for CPU)."""
        if self.is_cpu:
            return None
        return f"nvidia.com/mig-{self.mig}" if self.mig else RESOURCE_GPU

    def node_selector(self, arch: str | None = None) -> dict[str, str]:
        """Labels a node must carry to host this target (mixed MIG strategy: the resource does the rest)."""
        if self.is_cpu:
            sel: dict[str, str] = {}
        else:
            sel = {LABEL_PRODUCT: self.gpu}
            if self.mig:
                sel[LABEL_MIG_CONFIG_STATE] = "success"
        if arch:
            sel[LABEL_ARCH] = arch
        return sel

    def __str__(self) -> str:
        return f"{self.gpu}/{self.mig}" if self.mig else self.gpu


class GPUIdentity(BaseModel):
    """Everything about the device that decides an engine. Part of the engine key."""

    model_config = ConfigDict(frozen=True)
    product: str  # GFD product label, or "cpu"
    compute_capability: str  # "9.0"; "none" for CPU
    mig_profile: str  # a MIG profile or "full"
    sm_count: int  # 0 when unknown or CPU
    arch: str  # "amd64" | "arm64"

    def matches_target(self, target: GPUTarget) -> bool:
        return self.product == target.gpu and self.mig_profile == (target.mig or FULL_GPU)


class UnknownTargetError(ValueError):
    pass


def identity_for_target(
    target: GPUTarget,
    *,
    arch: str | None = None,
    compute_capability: str | None = None,
) -> GPUIdentity:
    """The identity of a target, from the known-GPU table, Node labels, or both.

    `compute_capability` and `arch` come from Node labels (operator) or the probe (builder/runtime);
    they are required for a product missing from :data:`KNOWN_GPUS`, and must agree with the table
    when the product is known.
    """
    if target.is_cpu:
        return GPUIdentity(
            product=CPU, compute_capability="none", mig_profile=FULL_GPU, sm_count=0, arch=arch or "amd64"
        )
    known = KNOWN_GPUS.get(target.gpu)
    mig = target.mig or FULL_GPU
    if known is None:
        if compute_capability is None:
            raise UnknownTargetError(
                f"GPU product {target.gpu!r} is not in the known-GPU table; its compute capability must "
                f"come from the node label {LABEL_CC_MAJOR}/{LABEL_CC_MINOR} or the GPU probe"
            )
        return GPUIdentity(
            product=target.gpu,
            compute_capability=compute_capability,
            mig_profile=mig,
            sm_count=0,
            arch=arch or "amd64",
        )
    cc = f"{known.compute_capability[0]}.{known.compute_capability[1]}"
    if compute_capability is not None and compute_capability != cc:
        raise UnknownTargetError(
            f"GPU product {target.gpu!r} reports compute capability {compute_capability}, expected {cc}"
        )
    if target.mig and target.mig not in known.mig_profiles:
        raise UnknownTargetError(
            f"MIG profile {target.mig!r} does not exist on {target.gpu}; "
            f"expected one of {', '.join(known.mig_profiles)}"
        )
    sms = known.mig_profiles[target.mig] if target.mig else known.sm_count
    return GPUIdentity(
        product=target.gpu, compute_capability=cc, mig_profile=mig, sm_count=sms, arch=arch or known.arch
    )
