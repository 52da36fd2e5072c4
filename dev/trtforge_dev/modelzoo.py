"""Real ONNX models for tests and benchmarks, made on the spot and cached.

- :func:`light_model` — the CNNs in the ``onnx`` package's test data (``onnx/backend/test/data/light/``:
  resnet50, densenet121, squeezenet, inception_v1, inception_v2, shufflenet, bvlc_alexnet, vgg19,
  zfnet512). Those files keep each weight as a ``ConstantOfShape`` node fed by a ``<name>__SHAPE``
  initializer; materialising puts seeded weights of that shape back as initializers (with onnx's own
  ``numpy_helper``), scaled per use so activations stay in range: He-normal conv/Gemm weights, small
  biases, batch-norm scale near 1 and variance positive. Input batch is fixed at 1, as exported.
- :func:`dynamic_cnn`, :func:`dynamic_mlp`, :func:`two_input_model` — small generated models whose
  batch (and for the MLP, feature) dimensions are symbolic.

Everything is cached under ``$TRTFORGE_MODEL_CACHE`` (default ``~/.cache/trtforge/models``), keyed by
name, seed and this module's version, written atomically so parallel test processes can share it.

    from trtforge_dev.modelzoo import light_model
    path = light_model("resnet50")   # ~100 MB, materialised once
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

VERSION = "1"
LIGHT_MODELS = (
    "resnet50",
    "densenet121",
    "squeezenet",
    "inception_v1",
    "inception_v2",
    "shufflenet",
    "bvlc_alexnet",
    "vgg19",
    "zfnet512",
)
# The one real input of each light model (the others listed as graph inputs are weights).
LIGHT_INPUTS = {"resnet50": "gpu_0/data_0", "shufflenet": "gpu_0/data_0"}


def cache_dir() -> Path:
    d = Path(os.environ.get("TRTFORGE_MODEL_CACHE") or Path.home() / ".cache" / "trtforge" / "models")
    d.mkdir(parents=True, exist_ok=True)
    return d


def light_input_name(name: str) -> str:
    return LIGHT_INPUTS.get(name, "data_0")


def _cached(file_name: str, make: Callable[[], Any]) -> Path:
    import onnx

    path = cache_dir() / file_name
    if path.exists():
        return path
    model = make()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{file_name}.", suffix=".tmp")
    os.close(fd)
    try:
        onnx.save_model(model, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def light_source(name: str) -> Path:
    import onnx

    if name not in LIGHT_MODELS:
        raise ValueError(f"unknown light model {name!r}; one of {', '.join(LIGHT_MODELS)}")
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def light_model(name: str, seed: int = 0) -> Path:
    """The path of the materialised light model `name` (cached)."""
    import onnx

    tag = f"{onnx.__version__}-{VERSION}-{seed}"
    return _cached(f"{name}-{tag}.onnx", lambda: materialise(onnx.load(str(light_source(name))), seed))


def _weight(
    rng: np.random.Generator, shape: tuple[int, ...], op: str, slot: int, follow: str | None
) -> np.ndarray:
    """Seeded weights for one ConstantOfShape output, by the op (and input slot) that consumes it."""
    if op in ("Conv", "Gemm", "MatMul", "ConvTranspose") and slot == 1:
        fan_in = int(np.prod(shape[1:])) if op != "Gemm" else int(shape[-1])
        return rng.normal(0.0, np.sqrt(2.0 / max(fan_in, 1)), shape)
    if op == "BatchNormalization":
        if slot == 1:  # scale
            return rng.uniform(0.8, 1.2, shape)
        if slot == 4:  # variance
            return rng.uniform(0.5, 1.5, shape)
        return rng.normal(0.0, 0.1, shape)  # bias, mean
    if op == "Unsqueeze" and follow == "Mul":
        return rng.uniform(0.8, 1.2, shape)
    return rng.normal(0.0, 0.02, shape)


def materialise(model: Any, seed: int = 0) -> Any:
    """Replace `ConstantOfShape(<name>__SHAPE)` weight nodes by seeded initializers of that shape."""
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, tuple[str, int]] = {}
    for node in g.node:
        for i, x in enumerate(node.input):
            consumers.setdefault(x, (node.op_type, i))
    rng = np.random.default_rng(seed)
    keep = []
    used_shapes: set[str] = set()
    for node in g.node:
        src = node.input[0] if node.input else ""
        if node.op_type == "ConstantOfShape" and src in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[src]))
            out = node.output[0]
            op, slot = consumers.get(out, ("", 0))
            follow = None
            if op == "Unsqueeze":  # the scale/shift vectors of DenseNet: see what the unsqueezed one feeds
                nxt = next((n for n in g.node if n.op_type == "Unsqueeze" and n.input[0] == out), None)
                if nxt is not None:
                    follow = consumers.get(nxt.output[0], ("", 0))[0]
            arr = _weight(rng, shape, op, slot, follow).astype(np.float32)
            g.initializer.append(numpy_helper.from_array(arr, out))
            used_shapes.add(src)
            continue
        keep.append(node)
    del g.node[:]
    g.node.extend(keep)
    left = [t for t in g.initializer if t.name not in used_shapes]
    del g.initializer[:]
    g.initializer.extend(left)
    inputs = [i for i in g.input if i.name not in used_shapes]
    del g.input[:]
    g.input.extend(inputs)
    # IR 4 lets initializers stand without being listed as graph inputs (the new weights are not).
    model.ir_version = max(model.ir_version, 4)
    return model


def _opset(model: Any, version: int = 17) -> Any:
    model.ir_version = 8
    del model.opset_import[:]
    op = model.opset_import.add()
    op.domain, op.version = "", version
    return model


def dynamic_cnn(seed: int = 0, channels: int = 8, classes: int = 10, size: int = 16) -> Path:
    """Conv-BN-ReLU twice, global pool, Gemm, Softmax; input `images` [batch, 3, size, size]."""

    def make() -> Any:
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(seed)
        c = channels

        def init(name: str, arr: np.ndarray) -> Any:
            return numpy_helper.from_array(arr.astype(np.float32), name)

        inits = [
            init("w1", rng.normal(0, np.sqrt(2 / 27), (c, 3, 3, 3))),
            init("b1", rng.normal(0, 0.1, c)),
            init("s1", rng.uniform(0.8, 1.2, c)),
            init("o1", rng.normal(0, 0.1, c)),
            init("m1", rng.normal(0, 0.1, c)),
            init("v1", rng.uniform(0.5, 1.5, c)),
            init("w2", rng.normal(0, np.sqrt(2 / (9 * c)), (c, c, 3, 3))),
            init("b2", rng.normal(0, 0.1, c)),
            init("wf", rng.normal(0, np.sqrt(1 / c), (classes, c))),
            init("bf", rng.normal(0, 0.1, classes)),
        ]
        nodes = [
            helper.make_node("Conv", ["images", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c1", "s1", "o1", "m1", "v1"], ["n1"]),
            helper.make_node("Relu", ["n1"], ["r1"]),
            helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
            helper.make_node("Relu", ["c2"], ["r2"]),
            helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
            helper.make_node("Flatten", ["p"], ["f"]),
            helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
            helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
        ]
        graph = helper.make_graph(
            nodes,
            "dynamic_cnn",
            [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, size, size])],
            [
                helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes]),
                helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", classes]),
            ],
            inits,
        )
        return _opset(helper.make_model(graph, producer_name="trtforge-tests"))

    return _cached(f"dynamic_cnn-{VERSION}-{seed}-{channels}-{classes}-{size}.onnx", make)


def dynamic_mlp(seed: int = 0, features: int = 32, hidden: int = 64, outputs: int = 8) -> Path:
    """MatMul-Add-Relu-MatMul-Add; input `x` [batch, features]."""

    def make() -> Any:
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(seed)
        inits = [
            numpy_helper.from_array(
                rng.normal(0, np.sqrt(2 / features), (features, hidden)).astype(np.float32), "w1"
            ),
            numpy_helper.from_array(rng.normal(0, 0.1, hidden).astype(np.float32), "b1"),
            numpy_helper.from_array(
                rng.normal(0, np.sqrt(1 / hidden), (hidden, outputs)).astype(np.float32), "w2"
            ),
            numpy_helper.from_array(rng.normal(0, 0.1, outputs).astype(np.float32), "b2"),
        ]
        nodes = [
            helper.make_node("MatMul", ["x", "w1"], ["h0"]),
            helper.make_node("Add", ["h0", "b1"], ["h1"]),
            helper.make_node("Relu", ["h1"], ["h"]),
            helper.make_node("MatMul", ["h", "w2"], ["y0"]),
            helper.make_node("Add", ["y0", "b2"], ["y"]),
        ]
        graph = helper.make_graph(
            nodes,
            "dynamic_mlp",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", outputs])],
            inits,
        )
        return _opset(helper.make_model(graph, producer_name="trtforge-tests"))

    return _cached(f"dynamic_mlp-{VERSION}-{seed}-{features}-{hidden}-{outputs}.onnx", make)


def qdq_mlp(seed: int = 0, features: int = 32, outputs: int = 8) -> Path:
    """An explicitly quantized (int8 Q/DQ) MatMul-Add; input `x` [batch, features] (what Model
    Optimizer produces, in miniature)."""

    def make() -> Any:
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(seed)
        w = rng.normal(0, 0.1, (features, outputs)).astype(np.float32)
        w_scale = np.float32(np.abs(w).max() / 127)
        inits = [
            numpy_helper.from_array(np.clip(np.round(w / w_scale), -127, 127).astype(np.int8), "w_q"),
            numpy_helper.from_array(np.array(w_scale, dtype=np.float32), "w_scale"),
            numpy_helper.from_array(np.array(0.05, dtype=np.float32), "x_scale"),
            numpy_helper.from_array(np.array(0, dtype=np.int8), "zero"),
            numpy_helper.from_array(rng.normal(0, 0.1, outputs).astype(np.float32), "b"),
        ]
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "x_scale", "zero"], ["x_q"]),
            helper.make_node("DequantizeLinear", ["x_q", "x_scale", "zero"], ["x_dq"]),
            helper.make_node("DequantizeLinear", ["w_q", "w_scale", "zero"], ["w_dq"]),
            helper.make_node("MatMul", ["x_dq", "w_dq"], ["y0"]),
            helper.make_node("Add", ["y0", "b"], ["y"]),
        ]
        graph = helper.make_graph(
            nodes,
            "qdq_mlp",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", outputs])],
            inits,
        )
        return _opset(helper.make_model(graph, producer_name="trtforge-tests"))

    return _cached(f"qdq_mlp-{VERSION}-{seed}-{features}-{outputs}.onnx", make)


def two_input_model(seed: int = 0, features: int = 16) -> Path:
    """y = relu(a @ W) + b_in * 0.5; inputs `a` [batch, features], `b_in` [batch, 4] (two profiles' worth)."""

    def make() -> Any:
        from onnx import TensorProto, helper, numpy_helper

        rng = np.random.default_rng(seed)
        inits = [
            numpy_helper.from_array(rng.normal(0, 0.3, (features, 4)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half"),
        ]
        nodes = [
            helper.make_node("MatMul", ["a", "w"], ["aw"]),
            helper.make_node("Relu", ["aw"], ["r"]),
            helper.make_node("Mul", ["b_in", "half"], ["bh"]),
            helper.make_node("Add", ["r", "bh"], ["y"]),
        ]
        graph = helper.make_graph(
            nodes,
            "two_input",
            [
                helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", features]),
                helper.make_tensor_value_info("b_in", TensorProto.FLOAT, ["batch", 4]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
            inits,
        )
        return _opset(helper.make_model(graph, producer_name="trtforge-tests"))

    return _cached(f"two_input-{VERSION}-{seed}-{features}.onnx", make)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
