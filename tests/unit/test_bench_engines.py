"""The benchmarks' own publisher (used where ``trtforge build`` is absent, as on the device host):
what it writes must be what the runtime reads and serves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, save
from trtforge_runtime.lifecycle.canary import read_canary

from benchmarks.engines import _publish_from_contract
from benchmarks.models import INPUT_SHAPE
from trtforge.contract.layout import CANARY, engine_dir
from trtforge.contract.manifest import Manifest


def _pooling_model(path: Path) -> Path:
    """[N, 3, 224, 224] -> [N, 3]: a model of the benchmarks' input shape that computes in a blink."""
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["data"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["out"]),
        ],
        "pool",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, ["N", *INPUT_SHAPE])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 3])],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_the_contract_publisher_writes_a_canary_the_runtime_reads(tmp_path: Path) -> None:
    model = _pooling_model(tmp_path / "pool.onnx")
    store = tmp_path / "store"
    _publish_from_contract(model, store)
    (d,) = (p.parent for p in store.rglob("manifest.json"))
    manifest = Manifest.from_json((d / "manifest.json").read_text())
    assert d == store / engine_dir(manifest.key) and manifest.canary.file == CANARY
    canary = read_canary(d / CANARY)  # the runtime's reader: the contract's format, not another
    assert (canary.input_names, canary.output_names, len(canary.inputs)) == (["data"], ["out"], 4)
    sess = ort.InferenceSession(str(d / manifest.engine_file), providers=["CPUExecutionProvider"])
    for ins, outs in zip(canary.inputs, canary.outputs, strict=True):
        assert ins["data"].shape == (1, *INPUT_SHAPE)
        np.testing.assert_allclose(sess.run(["out"], ins)[0], outs["out"], rtol=1e-6)
