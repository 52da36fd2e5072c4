"""ONNX model handling: load and check, IO, profiles against the model, batch, precision rewrites."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtforge.contract.engine_key import ShapeRange
from trtforge.contract.manifest import TensorSpec
from trtforge.logs import fields
from trtforge.tensorrt.policy import float32_only
from trtforge_builder.errors import BuildError

log = logging.getLogger(__name__)

BATCH_PARAM = "batch"
Dim = int | str | None  # a fixed size, a symbolic name, or unknown


@dataclass(frozen=True)
class IOTensor:
    name: str
    dtype: str  # numpy dtype name
    dims: tuple[Dim, ...]

    @property
    def static(self) -> bool:
        return all(isinstance(d, int) for d in self.dims)

    def spec(self) -> TensorSpec:
        return TensorSpec(
            name=self.name, dtype=self.dtype, shape=[d if isinstance(d, int) else -1 for d in self.dims]
        )


@dataclass(frozen=True)
class ModelIO:
    inputs: tuple[IOTensor, ...]
    outputs: tuple[IOTensor, ...]

    def input(self, name: str) -> IOTensor | None:
        return next((t for t in self.inputs if t.name == name), None)


def _np_dtype(elem_type: int) -> str:
    from onnx import helper

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return f"onnx:{elem_type}"


def _tensor(vi: Any) -> IOTensor:
    tt = vi.type.tensor_type
    dims: list[Dim] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(str(d.dim_param))
        else:
            dims.append(None)
    return IOTensor(name=vi.name, dtype=_np_dtype(tt.elem_type), dims=tuple(dims))


def model_io(model: Any) -> ModelIO:
    """The real inputs (graph inputs that are not initializers: old IR lists weights as inputs)."""
    inits = {i.name for i in model.graph.initializer}
    inputs = tuple(_tensor(i) for i in model.graph.input if i.name not in inits)
    outputs = tuple(_tensor(o) for o in model.graph.output)
    return ModelIO(inputs=inputs, outputs=outputs)


def load_model(path: Path, source: str) -> Any:
    """Parse and check an ONNX file; InvalidModel (naming `source`) when it is not a whole valid model."""
    import onnx

    try:
        model = onnx.load(str(path))
    except Exception as e:  # google.protobuf's DecodeError, onnx's own errors
        raise BuildError(
            f"model {source} is not a valid ONNX file (truncated or corrupt?): {_first_line(e)}",
            "InvalidModel",
            step="check-model",
        ) from e
    try:
        onnx.checker.check_model(str(path) if path.stat().st_size > (1 << 30) else model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as e:
        raise BuildError(
            f"model {source} fails the ONNX checker (truncated or corrupt?): {_first_line(e)}",
            "InvalidModel",
            step="check-model",
        ) from e
    io = model_io(model)
    if not io.inputs or not io.outputs:
        raise BuildError(
            f"model {source} has {len(io.inputs)} inputs and {len(io.outputs)} outputs; a "
            "whole model has at least one of each (truncated?)",
            "InvalidModel",
            step="check-model",
        )
    return model


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0][:300]


@dataclass(frozen=True)
class ResolvedProfiles:
    """Complete profiles (every input), and whether the model's fixed batch must become symbolic."""

    profiles: tuple[dict[str, ShapeRange], ...]
    make_batch_dynamic: int | None  # the model's fixed batch size to replace, or None


def resolve_profiles(io: ModelIO, asked: tuple[dict[str, ShapeRange], ...]) -> ResolvedProfiles:
    """Check the asked profiles against the model's inputs and fill in the static inputs."""
    names = [t.name for t in io.inputs]
    batch_fix: int | None = None
    out: list[dict[str, ShapeRange]] = []
    for n, prof in enumerate(asked or ({},)):
        where = f"profile {n}" if len(asked) > 1 else "--profile"
        for name in prof:
            if name not in names:
                raise BuildError(
                    f"{where}: the model has no input named {name!r}; its inputs are "
                    f"{', '.join(repr(x) for x in names)}",
                    "InvalidProfile",
                    step="check-profiles",
                )
        full: dict[str, ShapeRange] = {}
        for t in io.inputs:
            rng = prof.get(t.name)
            if rng is None:
                if not t.static:
                    raise BuildError(
                        f"input {t.name!r} has dynamic dimensions {_dims(t.dims)}; give its range with "
                        f"--profile {t.name}:MIN:OPT:MAX",
                        "InvalidProfile",
                        step="check-profiles",
                    )
                shape = tuple(int(d) for d in t.dims if isinstance(d, int))
                full[t.name] = ShapeRange(min=shape, opt=shape, max=shape)
                continue
            if len(rng.min) != len(t.dims):
                raise BuildError(
                    f"{where}: input {t.name!r} has rank {len(t.dims)} {_dims(t.dims)}, the "
                    f"profile gives rank {len(rng.min)}",
                    "InvalidProfile",
                    step="check-profiles",
                )
            for i, d in enumerate(t.dims):
                if not isinstance(d, int):
                    continue
                lo, opt, hi = rng.min[i], rng.opt[i], rng.max[i]
                if lo == opt == hi == d:
                    continue
                if i == 0:
                    if batch_fix is not None and batch_fix != d:
                        raise BuildError(
                            f"inputs have different fixed batch sizes ({batch_fix} and {d}); "
                            "cannot make the batch dynamic",
                            "InvalidProfile",
                            step="check-profiles",
                        )
                    batch_fix = d
                    continue
                raise BuildError(
                    f"{where}: input {t.name!r} dimension {i} is fixed at {d} in the model, the profile asks "
                    f"{lo}..{hi}",
                    "InvalidProfile",
                    step="check-profiles",
                )
            full[t.name] = rng
        out.append(full)
    return ResolvedProfiles(profiles=tuple(out), make_batch_dynamic=batch_fix)


def _dims(dims: tuple[Dim, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def make_batch_dynamic(model: Any, old_batch: int) -> Any:
    """A copy whose dimension 0 is the symbol `batch` on every input and output fixed at `old_batch`.

    Reshape targets that hard-code the batch (``[1, 2048]``) become ``[0, 2048]`` (copy dim 0).
    Intermediate shape annotations are dropped. The caller must check per-sample outputs unchanged
    (:func:`check_batch_equivalence`): a model may mix samples in ways no rewrite here can see.
    """
    import onnx
    from onnx import numpy_helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name for i in m.graph.initializer}
    for vi in [*[i for i in m.graph.input if i.name not in inits], *m.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if len(dims) and dims[0].HasField("dim_value") and dims[0].dim_value == old_batch:
            dims[0].Clear()
            dims[0].dim_param = BATCH_PARAM
    del m.graph.value_info[:]
    by_name = {i.name: i for i in m.graph.initializer}
    consts = {n.output[0]: n for n in m.graph.node if n.op_type == "Constant" and n.attribute}
    rewritten = 0
    for node in m.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        if any(a.name == "allowzero" and a.i == 1 for a in node.attribute):
            continue
        src = node.input[1]
        if src in by_name:
            t = by_name[src]
            arr = numpy_helper.to_array(t)
            if arr.ndim == 1 and arr.size > 1 and arr[0] == old_batch:
                arr = arr.copy()
                arr[0] = 0
                t.CopyFrom(numpy_helper.from_array(arr, t.name))
                rewritten += 1
        elif src in consts:
            attr = next((a for a in consts[src].attribute if a.name == "value"), None)
            if attr is not None:
                arr = numpy_helper.to_array(attr.t)
                if arr.ndim == 1 and arr.size > 1 and arr[0] == old_batch:
                    arr = arr.copy()
                    arr[0] = 0
                    attr.t.CopyFrom(numpy_helper.from_array(arr))
                    rewritten += 1
    log.info(
        "made the batch dimension symbolic", extra=fields(old_batch=old_batch, reshapes_rewritten=rewritten)
    )
    return m


def fix_static_shapes(model: Any, profiles: tuple[dict[str, ShapeRange], ...]) -> tuple[Any, list[str]]:
    """Fix input dims that one profile pins (min == max) so graph optimizations can fold shapes."""
    import onnx

    if len(profiles) != 1:
        return model, []
    m = onnx.ModelProto()
    m.CopyFrom(model)
    fixed: list[str] = []
    for vi in m.graph.input:
        rng = profiles[0].get(vi.name)
        if rng is None or rng.min != rng.max:
            continue
        dims = vi.type.tensor_type.shape.dim
        changed = False
        for d, size in zip(dims, rng.min, strict=False):
            if not d.HasField("dim_value"):
                d.Clear()
                d.dim_value = size
                changed = True
        if changed:
            fixed.append(vi.name)
    return m, fixed


def round_float_weights(model: Any, precision: str) -> tuple[Any, int]:
    """Round float32 initializers to fp16 or bf16 values (kept as float32): reduced-precision weights
    for a backend that computes in fp32 (ONNX Runtime on CPU)."""
    import onnx
    from onnx import TensorProto, numpy_helper

    if precision not in ("fp16", "bf16"):
        return model, 0
    m = onnx.ModelProto()
    m.CopyFrom(model)
    n = 0
    for t in m.graph.initializer:
        if t.data_type != TensorProto.FLOAT:
            continue
        arr = numpy_helper.to_array(t)
        if precision == "fp16":
            rounded = arr.astype(np.float16).astype(np.float32)
        else:
            bits = np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32)
            bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
                0xFFFF0000
            )
            rounded = bits.view(np.float32)
        t.CopyFrom(numpy_helper.from_array(rounded.reshape(arr.shape), t.name))
        n += 1
    return m, n


def op_types(model: Any) -> list[str]:
    """Every node's op type, subgraphs (If/Loop/Scan bodies) included."""
    out: list[str] = []

    def walk(graph: Any) -> None:
        for node in graph.node:
            out.append(node.op_type)
            for a in node.attribute:
                if a.HasField("g"):
                    walk(a.g)
                for g in a.graphs:
                    walk(g)

    walk(model.graph)
    return out


def convert_float_precision(model: Any, precision: str) -> Any:
    """A copy computing in fp16 or bf16, for strongly typed TensorRT (11+), which has no precision flags.

    Float32 initializers and Constant values become the low-precision type; each float32 graph input
    gets a Cast to it, each float32 graph output a Cast back, so the model's interface stays float32;
    Casts to float32 inside the graph cast to the low type. Initializers and Constants that ONNX
    requires to stay float32 (Resize/Upsample scales, Q/DQ scales:
    :data:`trtforge.tensorrt.policy.FLOAT32_ONLY_INPUTS`) are left as they are.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    target = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}[precision]
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph

    def low(arr: np.ndarray, name: str) -> Any:
        if target == TensorProto.FLOAT16:
            return numpy_helper.from_array(arr.astype(np.float16), name)
        t = helper.make_tensor(name, TensorProto.BFLOAT16, arr.shape, arr.astype(np.float32).ravel().tolist())
        return t

    keep = float32_only((n.op_type, list(n.input)) for n in g.node)
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT and t.name not in keep:
            t.CopyFrom(low(numpy_helper.to_array(t), t.name))
    for node in g.node:
        for a in node.attribute:
            if (
                node.op_type == "Constant"
                and a.name == "value"
                and a.t.data_type == TensorProto.FLOAT
                and not set(node.output) & keep
            ):
                a.t.CopyFrom(low(numpy_helper.to_array(a.t), a.t.name))
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = target
    inits = {t.name for t in g.initializer}
    renames: dict[str, str] = {}
    new_nodes: list[Any] = []
    for vi in g.input:
        if vi.name in inits or vi.type.tensor_type.elem_type != TensorProto.FLOAT:
            continue
        low_name = f"{vi.name}__{precision}"
        renames[vi.name] = low_name
        new_nodes.append(
            helper.make_node(
                "Cast", [vi.name], [low_name], to=target, name=f"trtforge_cast_in_{len(new_nodes)}"
            )
        )
    out_names = {o.name for o in g.output if o.type.tensor_type.elem_type == TensorProto.FLOAT}
    for node in g.node:
        for i, x in enumerate(node.input):
            if x in renames:
                node.input[i] = renames[x]
            elif x in out_names:  # an output also used inside the graph: use its low-precision twin
                node.input[i] = f"{x}__{precision}"
        for i, y in enumerate(node.output):
            if y in out_names:
                node.output[i] = f"{y}__{precision}"
    tail = [
        helper.make_node(
            "Cast", [f"{o}__{precision}"], [o], to=TensorProto.FLOAT, name=f"trtforge_cast_out_{k}"
        )
        for k, o in enumerate(sorted(out_names))
    ]
    nodes = [*new_nodes, *g.node, *tail]
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    return m


def save_model(model: Any, path: Path) -> None:
    """Save, with weights in a side file when the model is too large for one protobuf."""
    import onnx

    if model.ByteSize() > (1 << 31) - (1 << 26):
        onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save_model(model, str(path))
