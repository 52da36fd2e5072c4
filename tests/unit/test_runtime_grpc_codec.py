"""The hand-written ModelInfer codec (protocol/grpc_codec.py) against protobuf's own encoding and
decoding of the same messages: several datatypes and shapes, raw and typed contents, parameters at
every level, ids, merged messages."""

from __future__ import annotations

import numpy as np
import pytest
from trtforge_runtime.errors import RequestError
from trtforge_runtime.protocol.grpc_codec import encode_infer_response, parse_infer_request
from trtforge_runtime.protocol.grpc_tensors import decode_infer_request
from trtforge_runtime.protocol.grpc_v2 import inference_pb2 as pb
from trtforge_runtime.protocol.v2 import encode_bytes_blob, output_datatype
from trtforge_runtime.serving.model import V2_TO_NUMPY, InferRequest, ModelSpec, TensorInfo

# name: (datatype, shape, values)
TENSORS: dict[str, tuple[str, tuple[int, ...], np.ndarray]] = {
    "f32": ("FP32", (2, 3), np.arange(6, dtype=np.float32).reshape(2, 3) / 7),
    "i64": ("INT64", (4,), np.array([-(2**40), -1, 0, 2**40], np.int64)),
    "u8": ("UINT8", (1, 2, 2), np.array([[[0, 1], [254, 255]]], np.uint8)),
    "b": ("BOOL", (3,), np.array([True, False, True])),
    "f16": ("FP16", (2, 1), np.array([[1.5], [-2.25]], np.float16)),
    "empty": ("FP64", (0, 5), np.zeros((0, 5), np.float64)),
    "s": ("BYTES", (2,), np.array([b"a", "ünï".encode()], dtype=object)),
}


def _spec() -> ModelSpec:
    infos = tuple(
        TensorInfo(n, V2_TO_NUMPY[dt], dt, tuple(-1 for _ in shape)) for n, (dt, shape, _) in TENSORS.items()
    )
    return ModelSpec(
        name="many", version="3", platform="onnxruntime_onnx", inputs=infos, outputs=infos, max_batch=0
    )


def _blob(datatype: str, arr: np.ndarray) -> bytes:
    return encode_bytes_blob(arr) if datatype == "BYTES" else np.ascontiguousarray(arr).tobytes()


def _params(m: object, **values: object) -> None:
    for key, v in values.items():
        p = m[key]  # type: ignore[index]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            p.int64_param = v
        elif isinstance(v, float):
            p.double_param = v
        else:
            p.string_param = str(v)


def _raw_request(rid: str = "req-1", names: tuple[str, ...] = tuple(TENSORS)) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="many", model_version="3", id=rid)
    _params(msg.parameters, priority=2, sequence_start=True, tag="x", timeout=1.5)
    for name in names:
        datatype, shape, arr = TENSORS[name]
        t = msg.inputs.add(name=name, datatype=datatype, shape=list(shape))
        _params(t.parameters, binary_data_size=len(_blob(datatype, arr)))
        msg.raw_input_contents.append(_blob(datatype, arr))
    out = msg.outputs.add(name="f32")
    _params(out.parameters, binary_data=True, classification=0)
    return msg


def _typed_request() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="many", id="typed")
    t = msg.inputs.add(name="i64", datatype="INT64", shape=[4])
    t.contents.int64_contents.extend(TENSORS["i64"][2].tolist())
    t = msg.inputs.add(name="s", datatype="BYTES", shape=[2])
    t.contents.bytes_contents.extend(list(TENSORS["s"][2]))
    return msg


def _requests() -> list[tuple[str, bytes]]:
    raw = _raw_request().SerializeToString()
    return [
        ("raw contents, every datatype, parameters", raw),
        ("no id, one input", _raw_request("", ("f32",)).SerializeToString()),
        ("typed contents only", _typed_request().SerializeToString()),
        ("two messages merged", raw + _raw_request("req-2", ("u8",)).SerializeToString()),
        ("an empty message", b""),
    ]


@pytest.mark.parametrize(("case", "wire"), _requests(), ids=[c for c, _ in _requests()])
def test_a_request_parses_as_protobuf_parses_it_with_raw_contents_in_place(case: str, wire: bytes) -> None:
    theirs = pb.ModelInferRequest.FromString(wire)
    head, raw = parse_infer_request(wire)
    assert [bytes(r) for r in raw] == list(theirs.raw_input_contents)
    for r in raw:  # views of the message's own bytes, not copies
        assert isinstance(r, memoryview) and r.obj is wire
    whole = pb.ModelInferRequest()
    whole.CopyFrom(head)
    whole.raw_input_contents.extend(bytes(r) for r in raw)
    assert whole == theirs
    assert not head.raw_input_contents


@pytest.mark.parametrize(("case", "wire"), _requests()[:4], ids=[c for c, _ in _requests()[:4]])
def test_a_request_decodes_to_the_same_tensors_as_protobufs_message(case: str, wire: bytes) -> None:
    spec = _spec()
    head, raw = parse_infer_request(wire)
    try:
        theirs = decode_infer_request(pb.ModelInferRequest.FromString(wire), spec)
    except RequestError as e:  # the merged message names an input twice: refused alike
        with pytest.raises(RequestError, match=e.message):
            decode_infer_request(head, spec, raw)
        return
    ours = decode_infer_request(head, spec, raw)
    assert (ours.id, ours.outputs) == (theirs.id, theirs.outputs)
    assert list(ours.inputs) == list(theirs.inputs)
    for name, arr in theirs.inputs.items():
        assert ours.inputs[name].dtype == arr.dtype and ours.inputs[name].shape == arr.shape
        np.testing.assert_array_equal(ours.inputs[name], arr)
        np.testing.assert_array_equal(arr, TENSORS[name][2])


def _protobuf_response(spec: ModelSpec, req: InferRequest, results: dict[str, np.ndarray]) -> bytes:
    r = pb.ModelInferResponse(model_name=spec.name, model_version=spec.version, id=req.id or "")
    for name, _ in req.outputs:
        arr = results[name]
        datatype = output_datatype(arr)
        r.outputs.add(name=name, datatype=datatype, shape=list(arr.shape))
        r.raw_output_contents.append(_blob(datatype, arr))
    return r.SerializeToString()


RESPONSES = [
    ("every datatype", "r-1", tuple(TENSORS)),
    ("fixed-size outputs only (a kept frame)", "r-2", ("f32", "i64", "u8", "b", "f16", "empty")),
    ("no id", None, ("f32",)),
    ("a long id", "x" * 300, ("f32", "u8")),
    ("a scalar output", "r-3", ("scalar",)),
]


@pytest.mark.parametrize(("case", "rid", "names"), RESPONSES, ids=[c for c, *_ in RESPONSES])
def test_a_response_is_protobufs_byte_for_byte(case: str, rid: str | None, names: tuple[str, ...]) -> None:
    spec = _spec()
    results = {n: TENSORS[n][2] for n in names if n in TENSORS}
    if "scalar" in names:
        results["scalar"] = np.array(7, np.int32)
    req = InferRequest(id=rid, inputs={}, outputs=[(n, True) for n in names])
    for _ in range(2):  # the second answer of the same kind is built from the kept frame
        ours = encode_infer_response(spec, req, results)
        assert ours == _protobuf_response(spec, req, results)
    parsed = pb.ModelInferResponse.FromString(ours)
    for (name, _), out, blob in zip(req.outputs, parsed.outputs, parsed.raw_output_contents, strict=True):
        arr = results[name]
        assert (out.name, out.datatype, tuple(out.shape)) == (name, output_datatype(arr), arr.shape)
        assert blob == _blob(out.datatype, arr)
