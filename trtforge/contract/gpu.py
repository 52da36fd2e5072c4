"""GPU targets and identities: what an engine is built for and what a node or probe reports.

A *target* is what a user asks for (`{gpu: <nvidia.com/gpu.product>, mig: <profile>}`); an *identity*
is the full set of facts about that GPU that decide an engine (compute capability, SM count, MIG
slice, CPU architecture). Identities come only from a probe (NVML on a real GPU): the builder records
its own in the manifest and the runtime compares it with its own. Planning uses GFD Node labels. The
known-GPU table is for display and hints (docs/design.md §"GPU facts").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CPU = "cpu"
FULL_GPU = "full"

# GPU Feature Discovery label keys (docs/design.md §"GPU labels").
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

# MIG profiles as NVML names them: `<slices>g.<memory>gb`, and the variants with media extensions
# (`+me`, e.g. the H200's 1g.18gb+me) or Blackwell's `+gfx` and `-me`.
MIG_PROFILE_RE = re.compile(r"^[1-7]g\.[0-9]+gb(\+me|\+gfx|-me)?$")
# NVIDIA's device plugin advertises a profile as `nvidia.com/mig-<profile>` with `+` turned into `.`
# (resource names allow no `+`): 1g.18gb+me is `nvidia.com/mig-1g.18gb.me`.
_MIG_RESOURCE_VARIANT_RE = re.compile(r"^([1-7]g\.[0-9]+gb)\.(me|gfx)$")


class MigStrategy(StrEnum):
    """How NVIDIA's device plugin and GFD expose MIG on a node (the GPU Operator's `mig.strategy`;
    docs/design.md §"GPU labels")."""

    NONE = "none"  # whole GPUs: nvidia.com/gpu, product label as is
    SINGLE = "single"  # every GPU sliced alike: nvidia.com/gpu, product label <product>-MIG-<profile>
    MIXED = "mixed"  # slices as nvidia.com/mig-<profile>, product label as is


# GFD's product label under the single strategy: `<product>-MIG-<profile>`, e.g.
# NVIDIA-A100-SXM4-40GB-MIG-1g.5gb (a label value has no `+`: a variant is spelt as in the resource name).
_SINGLE_PRODUCT_RE = re.compile(r"^(?P<product>.+)-MIG-(?P<profile>[1-7]g\.[0-9]+gb(?:\.me|\.gfx|-me)?)$")


def single_strategy_product(label: str) -> tuple[str, str] | None:
    """(product, MIG profile) named by a single-strategy `nvidia.com/gpu.product` value, else None."""
    m = _SINGLE_PRODUCT_RE.match(label)
    return (m.group("product"), mig_profile_of_resource(m.group("profile"))) if m else None


def node_mig_strategy(labels: Mapping[str, str]) -> MigStrategy:
    """The MIG strategy a node's GFD labels show: single only where the product label names a slice."""
    if labels.get(LABEL_MIG_STRATEGY) == MigStrategy.SINGLE and single_strategy_product(
        labels.get(LABEL_PRODUCT, "")
    ):
        return MigStrategy.SINGLE
    return MigStrategy.MIXED if labels.get(LABEL_MIG_STRATEGY) == MigStrategy.MIXED else MigStrategy.NONE


def mig_resource_suffix(profile: str) -> str:
    """The part after `nvidia.com/mig-` of the resource that offers `profile`."""
    return profile.replace("+", ".")


def mig_profile_of_resource(suffix: str) -> str:
    """The MIG profile a `nvidia.com/mig-<suffix>` resource offers (inverse of mig_resource_suffix)."""
    m = _MIG_RESOURCE_VARIANT_RE.match(suffix)
    return f"{m.group(1)}+{m.group(2)}" if m else suffix


class MigFacts(BaseModel):
    """One MIG profile of a known GPU: for display and validation hints only (docs/design.md §"GPU facts")."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    sm_fraction: str  # NVIDIA's MIG user guide, "Supported MIG Profiles": e.g. "1/7"
    sm_count: int | None = None  # as NVML reported it on a real GPU; None where not measured
    memory_mib: int | None = None  # likewise


class KnownGPU(BaseModel):
    """Facts about a GPU product, for display and validation hints only.

    Nothing that decides correctness reads this table: the builder and runtime probe their GPU
    (NVML), and planning reads GFD labels (docs/design.md §"GPU facts").
    """

    model_config = ConfigDict(defer_build=True, frozen=True)
    compute_capability: tuple[int, int]
    sm_count: int
    memory_mib: int
    arch: Literal["amd64", "arm64"]
    mig: dict[str, MigFacts] = Field(default_factory=dict)
    source: str = ""

    @property
    def mig_profiles(self) -> list[str]:
        return list(self.mig)


# SM fractions of the 1g/1g(double memory)/2g/3g/4g/7g profiles on 7-slice GPUs (MIG user guide).
_FRACTIONS = ("1/7", "1/7", "2/7", "3/7", "4/7", "7/7")
MIG_GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html"


def _guide_rows(profiles: list[str]) -> dict[str, MigFacts]:
    return {p: MigFacts(sm_fraction=f) for p, f in zip(profiles, _FRACTIONS, strict=True)}


def _measured_rows(rows: list[tuple[str, int, int]]) -> dict[str, MigFacts]:
    return {
        p: MigFacts(sm_fraction=f, sm_count=sms, memory_mib=mib)
        for (p, sms, mib), f in zip(rows, _FRACTIONS, strict=True)
    }


# Keyed by the GFD `nvidia.com/gpu.product` value (spaces of the NVML name become dashes).
KNOWN_GPUS: dict[str, KnownGPU] = {
    "NVIDIA-A100-SXM4-80GB": KnownGPU(
        compute_capability=(8, 0),
        sm_count=108,
        memory_mib=81920,
        arch="amd64",
        mig=_guide_rows(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        source=MIG_GUIDE,
    ),
    "NVIDIA-H100-80GB-HBM3": KnownGPU(
        compute_capability=(9, 0),
        sm_count=132,
        memory_mib=81559,
        arch="amd64",
        mig=_guide_rows(["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
        source=MIG_GUIDE,
    ),
    "NVIDIA-H200": KnownGPU(
        compute_capability=(9, 0),
        sm_count=132,
        memory_mib=143771,
        arch="amd64",
        # NVML on a real H200, driver 580.159.04, nvmlDeviceGetGpuInstanceProfileInfoV (MIG off).
        mig={
            **_measured_rows(
                [
                    ("1g.18gb", 16, 16384),
                    ("1g.35gb", 26, 33280),
                    ("2g.35gb", 32, 33280),
                    ("3g.71gb", 60, 71424),
                    ("4g.71gb", 64, 71424),
                    ("7g.141gb", 132, 143360),
                ]
            ),
            "1g.18gb+me": MigFacts(sm_fraction="1/7", sm_count=16, memory_mib=16384),  # profile ID 20
        },
        source="NVML on a real H200 (docs/gpu-probe-h200.md); SM fractions: " + MIG_GUIDE,
    ),
    "NVIDIA-GH200-480GB": KnownGPU(
        compute_capability=(9, 0),
        sm_count=132,
        memory_mib=97871,
        arch="arm64",
        mig=_guide_rows(["1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"]),
        source=MIG_GUIDE,
    ),
    "NVIDIA-B200": KnownGPU(
        compute_capability=(10, 0),
        sm_count=148,
        memory_mib=183359,
        arch="amd64",
        mig=_guide_rows(["1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]),
        source=MIG_GUIDE,
    ),
}


def product_label(nvml_name: str) -> str:
    """The GFD label value for an NVML device name: `NVIDIA H100 80GB HBM3` -> `NVIDIA-H100-80GB-HBM3`."""
    return re.sub(r"\s+", "-", nvml_name.strip())


class GPUTarget(BaseModel):
    """What an engine is built for: a GPU product (or `cpu`) and optionally a MIG profile."""

    model_config = ConfigDict(defer_build=True, frozen=True)
    gpu: str = Field(min_length=1)
    mig: str | None = None

    @field_validator("mig")
    @classmethod
    def _mig_profile(cls, v: str | None) -> str | None:
        if v is not None and not MIG_PROFILE_RE.match(v):
            raise ValueError(
                f"mig profile {v!r} is not like '1g.10gb' or '1g.18gb+me' "
                "(<slices>g.<memory>gb, then optionally +me, +gfx or -me)"
            )
        return v

    @property
    def is_cpu(self) -> bool:
        return self.gpu == CPU

    @property
    def name(self) -> str:
        """A DNS-1123 label naming this target, stable and unique per (gpu, mig)."""
        base = "cpu" if self.is_cpu else self.gpu.lower().removeprefix("nvidia-")
        if self.mig:
            base = f"{base}-mig-{self.mig.replace('+', '-plus-')}"  # 1g.23gb+me and 1g.23gb-me differ
        slug = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")
        if len(slug) > 40:
            digest = hashlib.sha256(slug.encode()).hexdigest()[:8]
            slug = f"{slug[:31].rstrip('-')}-{digest}"
        return slug

    def resource_name(self, strategy: MigStrategy = MigStrategy.MIXED) -> str | None:
        """The extended resource a pod requests for one unit of this target (None for CPU): a MIG
        slice is `nvidia.com/mig-<profile>` under the mixed strategy, `nvidia.com/gpu` under single."""
        if self.is_cpu:
            return None
        if self.mig and strategy != MigStrategy.SINGLE:
            return f"nvidia.com/mig-{mig_resource_suffix(self.mig)}"
        return RESOURCE_GPU

    def single_strategy_product(self) -> str:
        """The product label a single-strategy node hosting this MIG target carries."""
        return f"{self.gpu}-MIG-{mig_resource_suffix(self.mig or '')}"

    def node_selector(
        self, arch: str | None = None, strategy: MigStrategy = MigStrategy.MIXED
    ) -> dict[str, str]:
        """Labels a node must carry to host this target: under the mixed strategy the product and a
        finished MIG config (the resource does the rest); under single the slice's product label."""
        if self.is_cpu:
            sel: dict[str, str] = {}
        elif self.mig and strategy == MigStrategy.SINGLE:
            sel = {
                LABEL_PRODUCT: self.single_strategy_product(),
                LABEL_MIG_STRATEGY: MigStrategy.SINGLE.value,
            }
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

    model_config = ConfigDict(defer_build=True, frozen=True)
    product: str  # GFD product label, or "cpu"
    compute_capability: str  # "9.0"; "none" for CPU
    mig_profile: str  # a MIG profile or "full"
    sm_count: int  # 0 when unknown or CPU
    arch: str  # "amd64" | "arm64"
    memory_mib: int = 0  # the device's (or MIG slice's) memory as probed; 0 when unknown

    def matches_target(self, target: GPUTarget) -> bool:
        return self.product == target.gpu and self.mig_profile == (target.mig or FULL_GPU)


class UnknownTargetError(ValueError):
    pass


def known_identity(target: GPUTarget, *, arch: str | None = None) -> GPUIdentity:
    """The identity the known-GPU table suggests for a target: for display, tests and the emulated
    test bed only. Builds and runtimes use their probe; planning uses Node labels."""
    if target.is_cpu:
        return GPUIdentity(
            product=CPU, compute_capability="none", mig_profile=FULL_GPU, sm_count=0, arch=arch or "amd64"
        )
    known = KNOWN_GPUS.get(target.gpu)
    if known is None:
        raise UnknownTargetError(f"GPU product {target.gpu!r} is not in the known-GPU table")
    if target.mig and target.mig not in known.mig:
        raise UnknownTargetError(
            f"MIG profile {target.mig!r} does not exist on {target.gpu}; "
            f"expected one of {', '.join(known.mig)}"
        )
    cc = f"{known.compute_capability[0]}.{known.compute_capability[1]}"
    facts = known.mig.get(target.mig) if target.mig else None
    sms = (facts.sm_count or 0) if facts is not None else known.sm_count
    mib = (facts.memory_mib or 0) if facts is not None else known.memory_mib
    return GPUIdentity(
        product=target.gpu,
        compute_capability=cc,
        mig_profile=target.mig or FULL_GPU,
        sm_count=sms,
        memory_mib=mib,
        arch=arch or known.arch,
    )
