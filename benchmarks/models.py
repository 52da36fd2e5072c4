"""The benchmark models: SqueezeNet and ResNet-50 from the ``onnx`` package's own test data.

The "light" test models carry no weights: each weight is a ``ConstantOfShape`` of its shape. We
materialise them into real initializers (seeded LeCun-normal conv/FC weights, identity batch-norm), so
ResNet-50 becomes a ~100 MB artifact, and make the batch dimension dynamic so a server can batch.
``tests/modelzoo.py`` (the builder's helpers) is used instead when it is present and offers the same.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from benchmarks.common import CACHE, log

MODELS = {"squeezenet": "light_squeezenet.onnx", "resnet50": "light_resnet50.onnx"}
INPUT_SHAPE = (3, 224, 224)


def _light_path(file_name: str) -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / file_name


def _from_modelzoo(name: str, dst: Path) -> Path | None:
    """The builder's materialiser, when it exists and offers this model with a dynamic batch."""
    try:
        from tests import modelzoo  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    fn = getattr(modelzoo, "materialise", None) or getattr(modelzoo, "materialize", None)
    if fn is None:
        return None
    try:
        out = fn(name, dst.parent, dynamic_batch=True)
    except TypeError:
        return None
    except Exception as e:
        log(f"tests/modelzoo.py could not materialise {name}: {e}; using the benchmark's own")
        return None
    return Path(out) if out else None


def _weight(rng: np.random.Generator, shape: tuple[int, ...], op: str, idx: int) -> np.ndarray:
    if op in ("Conv", "Gemm") and idx == 1:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        return (rng.standard_normal(shape) * np.sqrt(1.0 / fan_in)).astype(np.float32)
    if op == "BatchNormalization" and idx in (1, 4):  # scale, variance
        return np.ones(shape, np.float32)
    return np.zeros(shape, np.float32)  # biases, batch-norm shift and mean


def _materialise(name: str, dst: Path) -> Path:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(_light_path(MODELS[name])))
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    consumers: dict[str, tuple[str, int]] = {}
    for n in g.node:
        for i, t in enumerate(n.input):
            consumers.setdefault(t, (n.op_type, i))
    rng = np.random.default_rng(int(hashlib.sha256(name.encode()).hexdigest()[:8], 16))
    keep_nodes = []
    drop_inits: set[str] = set()
    new_inits = []
    for n in g.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
            op, idx = consumers.get(n.output[0], ("", 0))
            new_inits.append(numpy_helper.from_array(_weight(rng, shape, op, idx), n.output[0]))
            drop_inits.add(n.input[0])
            continue
        if n.op_type == "Reshape" and n.input[1] in inits:
            target = numpy_helper.to_array(inits[n.input[1]]).copy()
            if target.size and target[0] == 1:
                target[0] = 0  # copy the batch dimension from the input
                inits[n.input[1]].CopyFrom(numpy_helper.from_array(target, n.input[1]))
        keep_nodes.append(n)
    del g.node[:]
    g.node.extend(keep_nodes)
    kept = [i for i in g.initializer if i.name not in drop_inits]
    del g.initializer[:]
    g.initializer.extend(kept + new_inits)
    weight_names = {i.name for i in g.initializer}
    real_inputs = [i for i in g.input if i.name not in drop_inits and i.name not in weight_names]
    del g.input[:]
    g.input.extend(real_inputs)
    for vi in [*g.input, *g.output]:
        if vi.name in weight_names:
            continue
        dim0 = vi.type.tensor_type.shape.dim[0]
        dim0.ClearField("dim_value")
        dim0.dim_param = "batch"
    del g.value_info[:]
    model.ir_version = max(model.ir_version, 4)  # initializers need not be graph inputs from IR 4
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
    got = _from_modelzoo(name, dst)
    if got is not None and got.exists():
        return got
    log(f"materialising {name} from the onnx package's test data")
    return _materialise(name, dst)


def io_names(path: Path) -> tuple[str, str]:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    weights = {i.name for i in m.graph.initializer}
    ins = [i.name for i in m.graph.input if i.name not in weights]
    return ins[0], m.graph.output[0].name


def sample_input(batch: int = 1, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((batch, *INPUT_SHAPE), dtype=np.float32)
