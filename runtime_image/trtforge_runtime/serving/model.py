"""What the served model accepts: IO tensors from the manifest, the batch limit, request validation."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from trtforge.contract.engine_key import ShapeRange
from trtforge.contract.manifest import Manifest, TensorSpec
from trtforge.tensorrt.policy import covering_ranges
from trtforge_runtime.errors import RequestError

# Open Inference Protocol datatype <-> numpy dtype.
V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
}
NUMPY_TO_V2: dict[str, str] = {dt.name: v2 for v2, dt in V2_TO_NUMPY.items()}
NUMPY_TO_V2["str"] = "BYTES"
NUMPY_TO_V2["bytes"] = "BYTES"


def v2_datatype(numpy_name: str) -> str:
    try:
        return NUMPY_TO_V2[np.dtype(numpy_name).name if numpy_name not in ("str", "bytes") else numpy_name]
    except (KeyError, TypeError) as e:
        raise ValueError(f"tensor dtype {numpy_name!r} has no Open Inference Protocol datatype") from e


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: np.dtype
    datatype: str  # v2 name
    shape: tuple[int, ...]  # -1 where dynamic (dim 0 is -1 for a batchable model)
    range: ShapeRange | None = None  # from the first optimization profile, when it names this input

    def metadata(self) -> dict[str, object]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def max_elements(self, max_batch: int) -> int | None:
        """The most elements a valid tensor has (batch dim: `max_batch`); None when a dim is unbounded."""
        n = 1
        for i, d in enumerate(self.shape):
            if i == 0 and max_batch:
                d = max_batch
            elif self.range is not None and i < len(self.range.max):
                d = self.range.max[i]
            if d < 0:
                return None
            n *= d
        return n


def _info(t: TensorSpec, rng: ShapeRange | None = None) -> TensorInfo:
    dt = np.dtype(np.object_) if t.dtype in ("str", "bytes", "object") else np.dtype(t.dtype)
    return TensorInfo(t.name, dt, v2_datatype(dt.name if dt.kind != "O" else "str"), tuple(t.shape), rng)


@dataclass(frozen=True)
class ModelSpec:
    """The served model. Derived values are computed once (every request consults them)."""

    name: str
    version: str
    platform: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    max_batch: int  # 0: not batchable (requests run one by one with the shapes as declared)

    @cached_property
    def input_by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.inputs}

    @cached_property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    @cached_property
    def has_bytes_inputs(self) -> bool:
        return any(t.datatype == "BYTES" for t in self.inputs)

    def metadata(self) -> dict[str, object]:
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": self.platform,
            "inputs": [t.metadata() for t in self.inputs],
            "outputs": [t.metadata() for t in self.outputs],
        }

    @cached_property
    def max_values(self) -> int | None:
        """The most values one valid request can carry over all inputs; None when a shape is unbounded."""
        total = 0
        for t in self.inputs:
            n = t.max_elements(self.max_batch)
            if n is None:
                return None
            total += n
        return total

    def check_input(self, name: str, datatype: str, shape: tuple[int, ...]) -> TensorInfo:
        """Check one input's name, datatype and shape as the request header declares them.

        Runs before any tensor data is decoded, so a request for more than the model can take is
        refused at the cost of reading its header only.
        """
        t = self.input_by_name.get(name)
        if t is None:
            raise RequestError(
                400, f"unknown input {name!r}; the model takes {[i.name for i in self.inputs]}"
            )
        if datatype != t.datatype:
            raise RequestError(400, f"input {name!r} has datatype {datatype}, expected {t.datatype}")
        self._check_shape(t, shape)
        return t

    def _check_shape(self, t: TensorInfo, shape: tuple[int, ...]) -> None:
        if len(shape) != len(t.shape) or any(d != -1 and s != d for s, d in zip(shape, t.shape, strict=True)):
            raise RequestError(
                400, f"input {t.name!r} has shape {list(shape)}, expected {list(t.shape)} (-1: any size)"
            )
        if t.range is not None:
            lo, hi = list(t.range.min), list(t.range.max)
            first = 1 if self.max_batch else 0
            for i in range(first, len(shape)):
                if not lo[i] <= shape[i] <= hi[i]:
                    raise RequestError(
                        400,
                        f"input {t.name!r} dimension {i} is {shape[i]}, outside the "
                        f"engine's profile range {lo[i]}..{hi[i]}",
                    )
        if self.max_batch:
            if shape[0] < 1:
                raise RequestError(400, "batch size (dimension 0) must be at least 1")
            if shape[0] > self.max_batch:
                raise RequestError(
                    400, f"batch size {shape[0]} exceeds the model's max batch size {self.max_batch}"
                )

    def validate(self, inputs: dict[str, np.ndarray]) -> int:
        """Check a request's tensors against the model; the number of rows (batch) it carries."""
        spec = self.input_by_name
        missing = [n for n in spec if n not in inputs]
        if missing:
            raise RequestError(400, f"request is missing input(s) {missing}; the model takes {list(spec)}")
        unknown = [n for n in inputs if n not in spec]
        if unknown:
            raise RequestError(400, f"unknown input(s) {unknown}; the model takes {list(spec)}")
        rows = -1
        for name, arr in inputs.items():
            t = spec[name]
            if arr.dtype != t.dtype and not (t.dtype.kind == "O" and arr.dtype.kind == "O"):
                raise RequestError(
                    400,
                    f"input {name!r} has datatype {NUMPY_TO_V2.get(arr.dtype.name, arr.dtype.name)},"
                    f" expected {t.datatype}",
                )
            self._check_shape(t, arr.shape)
            if self.max_batch:
                if rows not in (-1, arr.shape[0]):
                    raise RequestError(
                        400,
                        f"inputs disagree on the batch size (dimension 0): {rows} and "
                        f"{arr.shape[0]} ({name!r})",
                    )
                rows = arr.shape[0]
        return rows if self.max_batch else 1


@dataclass
class InferRequest:
    """A decoded inference request, whichever protocol it came by: its tensors, checked against the
    model, and the outputs it asks for (name, whether binary: HTTP's choice; gRPC's are all raw)."""

    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[tuple[str, bool]]


def config_datatype(datatype: str) -> str:
    """Triton's model-configuration name of a v2 datatype (``FP32`` -> ``TYPE_FP32``; ``BYTES`` is
    ``TYPE_STRING``)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


@dataclass(frozen=True)
class Serving:
    """How the model is served, as Triton's model configuration tells it."""

    backend: str  # the manifest's: "onnxruntime" or "tensorrt"
    instances: int
    max_queue_delay_us: int
    max_queue: int


def model_config(spec: ModelSpec, serving: Serving) -> dict[str, object]:
    """The model's configuration in Triton's model-configuration form (the extension's JSON; the
    gRPC ModelConfig message has the same fields). Dims leave out the batch dimension of a batchable
    model, as Triton's do."""

    def dims(t: TensorInfo) -> list[int]:
        return list(t.shape[1:] if spec.max_batch else t.shape)

    cfg: dict[str, object] = {
        "name": spec.name,
        "platform": spec.platform,
        "backend": serving.backend,
        "max_batch_size": spec.max_batch,
        "input": [
            {"name": t.name, "data_type": config_datatype(t.datatype), "dims": dims(t)} for t in spec.inputs
        ],
        "output": [
            {"name": t.name, "data_type": config_datatype(t.datatype), "dims": dims(t)} for t in spec.outputs
        ],
        "instance_group": [
            {"count": serving.instances, "kind": "KIND_GPU" if serving.backend == "tensorrt" else "KIND_CPU"}
        ],
    }
    if spec.max_batch:
        cfg["dynamic_batching"] = {
            "max_queue_delay_microseconds": serving.max_queue_delay_us,
            "default_queue_policy": {"max_queue_size": serving.max_queue},
        }
    return cfg


def default_model_name(manifest: Manifest) -> str:
    """The model's file name without extension (`.../resnet50.onnx` -> `resnet50`), else `model`."""
    base = manifest.model_uri.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]
    base = re.sub(r"\.(onnx|plan|engine)$", "", base)
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", base).strip("._-")
    return base or "model"


def model_spec(manifest: Manifest, name: str, max_batch_cap: int | None = None) -> ModelSpec:
    """The served model from its manifest.

    Batchable when every input and output has a dynamic dimension 0; the max batch is the largest
    dimension 0 any optimization profile accepts (or ``max_batch_cap`` when the manifest has no
    profile), capped by ``max_batch_cap``. Shapes are checked against what all profiles together
    cover; the backend picks the profile that fits each batch (docs/design.md §"TensorRT").
    """
    profile = covering_ranges(manifest.build.profiles)
    inputs = tuple(_info(t, profile.get(t.name)) for t in manifest.inputs)
    outputs = tuple(_info(t) for t in manifest.outputs)
    batchable = all(t.shape and t.shape[0] == -1 for t in (*inputs, *outputs))
    max_batch = 0
    if batchable:
        limits = [t.range.max[0] for t in inputs if t.range is not None]
        fallback = max_batch_cap if max_batch_cap is not None else 64
        max_batch = min(limits) if limits else fallback
        if max_batch_cap is not None:
            max_batch = max(1, min(max_batch, max_batch_cap))
    platform = "tensorrt_plan" if manifest.backend == "tensorrt" else "onnxruntime_onnx"
    return ModelSpec(
        name=name, version="1", platform=platform, inputs=inputs, outputs=outputs, max_batch=max_batch
    )
