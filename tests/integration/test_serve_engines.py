"""Engines for the `trtforge serve` tests: real ONNX models laid out in a store the way builds lay them out.

`engines/<key>/{model.onnx, canary.npz, manifest.json}`, with the manifest written last, its fields
filled by the contract's own models. No tests here; the test modules import these helpers.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from trtforge.contract import layout
from trtforge.contract.canary import Canary
from trtforge.contract.engine_key import BuildConfig, EngineKeyRecord, ShapeRange, engine_key
from trtforge.contract.gpu import GPUIdentity, GPUTarget, identity_for_target
from trtforge.contract.gpu_probe import EmulatedGPUFile, GPUDevice
from trtforge.contract.manifest import Accuracy, CanaryRef, Manifest, TensorSpec

H100 = identity_for_target(GPUTarget(gpu="NVIDIA-H100-80GB-HBM3"))
B200 = identity_for_target(GPUTarget(gpu="NVIDIA-B200"))
H100_UUID = "GPU-11111111-2222-3333-4444-555555555555"


def light_model(name: str, seed: int = 0) -> bytes:
    """An `onnx/backend/test/data/light/light_<name>.onnx` model with its weights materialised.

    The light models make their weights at run time with ConstantOfShape; here each becomes a seeded
    random initializer of that shape, so the model has its real size and non-trivial outputs.
    """
    path = Path(onnx.__file__).parent / "backend/test/data/light" / f"light_{name}.onnx"
    m = onnx.load(str(path))
    rng = np.random.default_rng(seed)
    shapes = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    keep_nodes = []
    consumed: set[str] = set()
    new_inits = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in shapes:
            consumed.add(n.input[0])
            shape = tuple(int(d) for d in shapes.pop(n.input[0]))
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            if len(shape) == 1:
                w = rng.uniform(0.5, 1.5, shape)
            else:
                w = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape)
            new_inits.append(numpy_helper.from_array(w.astype(np.float32), n.output[0]))
        else:
            keep_nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep_nodes)
    used = {x for n in keep_nodes for x in n.input}
    old = [i for i in m.graph.initializer if i.name in shapes and i.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(old + new_inits)
    init_names = {i.name for i in m.graph.initializer}
    dropped = init_names | consumed
    inputs = [i for i in m.graph.input if i.name not in dropped and i.name in used]
    del m.graph.input[:]
    m.graph.input.extend(inputs)
    return m.SerializeToString()


def dynamic_batch_model(features: int = 64, classes: int = 10, seed: int = 1) -> bytes:
    """x[N, features] -> softmax(relu(x W1 + b1) W2 + b2) as y[N, classes]; N is dynamic."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.2, (features, 128)).astype(np.float32)
    w2 = rng.normal(0, 0.2, (128, classes)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["hr"]),
        helper.make_node("MatMul", ["hr", "w2"], ["z"]),
        helper.make_node("Softmax", ["z"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def _dims(vi: onnx.ValueInfoProto) -> list[int]:
    return [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]


def run_ort(model: bytes, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs), strict=True))


def write_engine(
    store: Path,
    model: bytes,
    *,
    name: str,
    gpu: GPUIdentity = H100,
    samples: int = 2,
    max_batch: int | None = None,
    canary_outputs: dict[str, np.ndarray] | None = None,
    seed: int = 7,
) -> str:
    """Lay out one engine (artifact, canary, manifest last) under `store`; its key."""
    m = onnx.load_from_string(model)
    ins = [i for i in m.graph.input if i.name not in {x.name for x in m.graph.initializer}]
    dtype_of = {TensorProto.FLOAT: "float32", TensorProto.INT64: "int64"}
    inputs = [
        TensorSpec(name=i.name, dtype=dtype_of[i.type.tensor_type.elem_type], shape=_dims(i)) for i in ins
    ]
    outputs = [
        TensorSpec(name=o.name, dtype=dtype_of[o.type.tensor_type.elem_type], shape=_dims(o))
        for o in m.graph.output
    ]
    rng = np.random.default_rng(seed)
    batchable = all(t.shape[0] == -1 for t in inputs)
    n = samples if batchable else inputs[0].shape[0]
    feeds = {
        t.name: rng.standard_normal([n if d == -1 else d for d in t.shape]).astype(t.dtype) for t in inputs
    }
    refs = canary_outputs if canary_outputs is not None else run_ort(model, feeds)
    canary = Canary(
        input_names=list(feeds),
        output_names=list(refs),
        inputs=[
            {k: v[i : i + 1] if batchable else v for k, v in feeds.items()}
            for i in range(n if batchable else 1)
        ],
        outputs=[
            {k: v[i : i + 1] if batchable else v for k, v in refs.items()}
            for i in range(n if batchable else 1)
        ],
    ).to_bytes()
    model_sha = hashlib.sha256(model).hexdigest()
    profiles: tuple[dict[str, ShapeRange], ...] = ()
    if batchable and max_batch:
        profiles = (
            {
                t.name: ShapeRange(
                    min=(1, *t.shape[1:]),
                    opt=(max(1, max_batch // 2), *t.shape[1:]),
                    max=(max_batch, *t.shape[1:]),
                )
                for t in inputs
            },
        )
    build = BuildConfig(precision="fp32", profiles=profiles)
    record = EngineKeyRecord(
        model_sha256=model_sha,
        build=build,
        backend="onnxruntime",
        backend_version=ort.__version__,
        cuda="none",
        gpu=gpu,
    )
    key = engine_key(record)
    d = store / layout.engine_dir(key)
    d.mkdir(parents=True, exist_ok=True)
    (d / "model.onnx").write_bytes(model)
    (d / layout.CANARY).write_bytes(canary)
    manifest = Manifest(
        key=key,
        engine_file="model.onnx",
        sha256=model_sha,
        size_bytes=len(model),
        backend="onnxruntime",
        backend_version=ort.__version__,
        cuda="none",
        gpu=gpu,
        build=build,
        model_uri=f"file:///models/{name}.onnx",
        model_sha256=model_sha,
        inputs=inputs,
        outputs=outputs,
        build_seconds=0.0,
        accuracy=Accuracy(samples=n, max_abs_error=0.0, max_rel_error=0.0, atol=1e-4, rtol=1e-3, passed=True),
        canary=CanaryRef(file=layout.CANARY, sha256=hashlib.sha256(canary).hexdigest(), atol=1e-4, rtol=1e-3),
    )
    (d / layout.MANIFEST).write_text(manifest.to_json())
    return key


def write_gpu_file(path: Path, devices: list[GPUDevice] | None = None) -> Path:
    """An emulated node with one H100 (the engines above are built for it)."""
    devs = devices or [
        GPUDevice(
            index=0,
            uuid=H100_UUID,
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81559,
            compute_capability="9.0",
            sm_count=132,
        )
    ]
    EmulatedGPUFile(node="node-a", devices=devs).write(path)
    return path


def inject_xid(path: Path, xid: int, uuid: str = H100_UUID) -> None:
    from trtforge.contract.gpu_probe import XidEvent

    f = EmulatedGPUFile.read(path)
    for d in f.devices:
        if d.uuid == uuid:
            d.xid_events.append(XidEvent(xid=xid, gpu_uuid=uuid, message=f"injected Xid {xid}"))
            d.healthy = False
    f.write(path)


def termination(path: Path) -> dict[str, object]:
    return dict(json.loads(path.read_text().strip().splitlines()[-1])) if path.exists() else {}


def env_for(gpu_file: Path, term_log: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "TRTFORGE_GPU_PROBE": f"emulated:{gpu_file}",
            "NVIDIA_VISIBLE_DEVICES": "all",
            "TRTFORGE_TERMINATION_LOG": str(term_log),
            "TRTFORGE_LOG_FORMAT": "json",
        }
    )
    return env
