"""The benchmark models: SqueezeNet and ResNet-50 from the ``onnx`` package's own test data.

``dev/trtforge_dev/modelzoo.py`` materialises their weights (ResNet-50 becomes a ~100 MB file); here the batch
dimension is made symbolic so that a server can batch requests (the exported models fix it at 1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.common import CACHE, log
from benchmarks.servers import Model

MODELS = ("squeezenet", "resnet50")
INPUT_SHAPE = (3, 224, 224)


def _dynamic_batch(src: Path, dst: Path) -> Path:
    """`src` with a symbolic batch dimension (and weights no longer listed as graph inputs)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    for n in g.node:
        if n.op_type == "Reshape" and n.input[1] in inits:
            target = numpy_helper.to_array(inits[n.input[1]]).copy()
            if target.size and target[0] == 1:
                target[0] = 0  # copy the batch dimension from the input
                inits[n.input[1]].CopyFrom(numpy_helper.from_array(target, n.input[1]))
    # Weights listed as graph inputs could be overridden, so ONNX Runtime would not fold them.
    real_inputs = [i for i in g.input if i.name not in inits]
    del g.input[:]
    g.input.extend(real_inputs)
    for vi in [*g.input, *g.output]:
        dim0 = vi.type.tensor_type.shape.dim[0]
        dim0.ClearField("dim_value")
        dim0.dim_param = "batch"
    del g.value_info[:]
    model.ir_version = max(model.ir_version, 4)
    onnx.checker.check_model(model)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(dst)
    return dst


def model_file(name: str) -> Path:
    """The materialised ONNX file for `name` (cached under .cache/bench/models)."""
    dst = CACHE / "models" / f"{name}.onnx"
    if dst.exists():
        return dst
    from trtforge_dev.modelzoo import light_model

    log(f"materialising {name} (dev/trtforge_dev/modelzoo.py) with a dynamic batch dimension")
    return _dynamic_batch(light_model(name), dst)


def io_names(path: Path) -> tuple[str, str]:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    weights = {i.name for i in m.graph.initializer}
    ins = [i.name for i in m.graph.input if i.name not in weights]
    return ins[0], m.graph.output[0].name


def sample_input(batch: int = 1, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, *INPUT_SHAPE), dtype=np.float32)


def model_info(name: str) -> Model:
    """Everything a server needs to serve `name`: its file, tensor names and per-row shapes."""
    import onnx

    path = model_file(name)
    in_name, out_name = io_names(path)
    m = onnx.load(str(path), load_external_data=False)
    out = next(o for o in m.graph.output if o.name == out_name)
    out_shape = tuple(d.dim_value for d in out.type.tensor_type.shape.dim[1:])
    if any(d <= 0 for d in out_shape):
        raise ValueError(f"{path}: output {out_name!r} has a symbolic dimension past the batch: {out_shape}")
    return Model(name, path, in_name, out_name, INPUT_SHAPE, out_shape)
