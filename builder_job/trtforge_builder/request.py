"""What one build is asked to do, parsed and checked from the command line (or built in code).

Shapes are written ``1x3x224x224``. A profile entry is ``INPUT:MIN:OPT:MAX`` (the input name may
itself hold ``:``, the shapes are taken from the right). Entries add inputs to the current
optimization profile; an input that is already in it starts the next profile, so
``--profile x:1x3:4x3:8x3 --profile x:16x3:16x3:32x3`` asks for two profiles.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtforge.contract.engine_key import BuildConfig, HardwareCompatibility, Precision, ShapeRange
from trtforge.contract.gpu import GPUTarget
from trtforge.contract.quantity import QuantityError, quantity_to_bytes
from trtforge_builder.errors import BuildError

BackendChoice = Literal["auto", "tensorrt", "onnxruntime"]

# Validation tolerances per precision (the operator's defaults for spec.validation are the same).
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {  # precision -> (rtol, atol)
    "fp32": (1e-4, 1e-5),
    "fp16": (1e-2, 1e-3),
    "bf16": (5e-2, 1e-2),
    "auto": (5e-2, 1e-2),
    "int8": (1e-1, 5e-2),
    "fp8": (1e-1, 5e-2),
}
DEFAULT_SAMPLES = 4

_SHAPE_RE = re.compile(r"^[0-9]+(x[0-9]+)*$")


def parse_shape(text: str, what: str = "shape") -> tuple[int, ...]:
    """`1x3x224x224` -> (1, 3, 224, 224); a scalar input has the empty shape, written ``""``."""
    text = text.strip()
    if text == "":
        return ()
    if not _SHAPE_RE.match(text):
        raise BuildError(
            f"{what} {text!r} is not like 1x3x224x224 (positive integers joined by 'x')",
            "InvalidArgument",
            step="parse-arguments",
        )
    return tuple(int(d) for d in text.split("x"))


def parse_profiles(entries: list[str]) -> tuple[dict[str, ShapeRange], ...]:
    """`INPUT:MIN:OPT:MAX` entries -> optimization profiles (see the module docstring)."""
    profiles: list[dict[str, ShapeRange]] = []
    current: dict[str, ShapeRange] = {}
    for entry in entries:
        parts = entry.rsplit(":", 3)
        if len(parts) != 4 or not parts[0]:
            raise BuildError(
                f"--profile {entry!r} is not INPUT:MIN:OPT:MAX (e.g. input:1x3x224x224:"
                "8x3x224x224:32x3x224x224)",
                "InvalidArgument",
                step="parse-arguments",
            )
        name = parts[0]
        lo, opt, hi = (parse_shape(s, f"--profile {name} shape") for s in parts[1:])
        try:
            rng = ShapeRange(min=lo, opt=opt, max=hi)
        except ValidationError as e:
            msg = e.errors()[0]["msg"].removeprefix("Value error, ")
            raise BuildError(f"--profile {entry!r}: {msg}", "InvalidProfile", step="parse-arguments") from e
        if name in current:
            profiles.append(current)
            current = {}
        current[name] = rng
    if current:
        profiles.append(current)
    return tuple(profiles)


def parse_quantity(text: str, what: str = "--workspace") -> int:
    """A byte count from a Kubernetes quantity (`4Gi`, `512Mi`, `2G`, `1073741824`), rounded up exactly
    as the operator rounds ``spec.builder.workspace``, so both compute the same engine key."""
    try:
        return quantity_to_bytes(text)
    except QuantityError as e:
        raise BuildError(f"{what}: {e}", "InvalidArgument", step="parse-arguments") from e


class BuildRequest(BaseModel):
    """Everything one `trtforge build` run needs."""

    model_config = ConfigDict(frozen=True)
    model_uri: str
    model_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    target: GPUTarget
    build: BuildConfig = Field(default_factory=BuildConfig)
    store_uri: str
    backend: BackendChoice = "auto"
    timing_cache: bool = True
    timeout_s: float | None = None
    samples: int = Field(default=DEFAULT_SAMPLES, ge=1, le=1024)
    rtol: float | None = Field(default=None, ge=0)
    atol: float | None = Field(default=None, ge=0)
    seed: int = 0
    rebuild: bool = False  # build and replace even when the store has the key (after a GPU fault)
    workdir: Path | None = None  # scratch space (default: a temp dir)
    # The operator's request key: the engine is filed under it (docs/design.md §"Engine keys").
    request_key: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    # The model is the verified copy the broker staged in the store (models/<sha256>/), not model_uri.
    staged_model: bool = False
    cache_scope: str = Field(default="", pattern=r"^$|^(ns|group):[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

    @property
    def tolerances(self) -> tuple[float, float]:
        """(rtol, atol): what was asked, else the precision's defaults."""
        rtol, atol = DEFAULT_TOLERANCES[self.build.precision]
        return (self.rtol if self.rtol is not None else rtol, self.atol if self.atol is not None else atol)


def make_build_config(
    *,
    precision: Precision = "fp16",
    profiles: tuple[dict[str, ShapeRange], ...] = (),
    optimization_level: int = 3,
    workspace_bytes: int | None = None,
    hardware_compatibility: HardwareCompatibility = "none",
    version_compatible: bool = False,
    strip_weights: bool = False,
) -> BuildConfig:
    if strip_weights:
        raise BuildError(
            "--strip-weights is refused: the runtime does not refit weight-stripped engines yet "
            "(docs/design.md, TensorRT); build without it",
            "InvalidArgument",
            step="parse-arguments",
        )
    try:
        return BuildConfig(
            precision=precision,
            profiles=profiles,
            optimization_level=optimization_level,
            workspace_bytes=workspace_bytes,
            hardware_compatibility=hardware_compatibility,
            version_compatible=version_compatible,
            strip_weights=strip_weights,
        )
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise BuildError(
            f"build setting {field}: {err['msg']}", "InvalidArgument", step="parse-arguments"
        ) from e
