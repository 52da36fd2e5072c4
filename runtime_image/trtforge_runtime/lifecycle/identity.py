"""Does the engine's GPU identity (manifest) match the GPU this process got (probe)?"""

from __future__ import annotations

from trtforge.contract.gpu import GPUIdentity
from trtforge.contract.manifest import Manifest
from trtforge_runtime.errors import Refusal


def _describe(g: GPUIdentity) -> str:
    sms = g.sm_count or "?"
    return f"{g.product} (compute {g.compute_capability}, MIG {g.mig_profile}, {sms} SMs, {g.arch})"


def check_identity(manifest: Manifest, probed: GPUIdentity) -> None:
    """Refuse (GPUMismatch) unless the probed device is the one the engine was built for.

    Exact match on product, compute capability, MIG profile and CPU architecture, and on the SM
    count when both sides know it. A hardware-compatible engine relaxes the product (and SM count):
    ``sameComputeCapability`` needs the same compute capability, ``amperePlus`` compute 8.0 or later.
    """
    built = manifest.gpu
    hw = manifest.build.hardware_compatibility
    wrong: list[str] = []
    if built.arch != probed.arch:
        wrong.append("CPU architecture")
    if hw == "amperePlus" and built.product != "cpu":
        try:
            ok = float(probed.compute_capability) >= 8.0
        except ValueError:
            ok = False
        if not ok:
            wrong.append("compute capability (amperePlus needs 8.0 or later)")
    else:
        if built.compute_capability != probed.compute_capability:
            wrong.append("compute capability")
        if hw == "none":
            if built.product != probed.product:
                wrong.append("GPU product")
            if built.sm_count and probed.sm_count and built.sm_count != probed.sm_count:
                wrong.append("SM count")
    if built.mig_profile != probed.mig_profile and hw == "none":
        wrong.append("MIG profile")
    if wrong:
        raise Refusal(
            "GPUMismatch",
            f"engine {manifest.key} was built for {_describe(built)} but this pod's device is "
            f"{_describe(probed)}: differs in {', '.join(wrong)}; refusing to load it (schedule the pod on "
            f"a matching node, or build the engine for this GPU)",
        )
