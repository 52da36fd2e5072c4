"""The v2 gRPC protocol in-process: our inference.proto against tritonclient's own descriptors (a client
no one here wrote), the shipped stubs against a fresh generation, and the request/response codec."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc.service_pb2 as triton_pb
from google.protobuf.descriptor import Descriptor
from trtforge_runtime.errors import Code, RequestError, outcome_for
from trtforge_runtime.errors import grpc_code as code_for
from trtforge_runtime.protocol.grpc_codec import (
    RAW_INPUT_CONTENTS,
    encode_infer_response,
    parse_infer_request,
)
from trtforge_runtime.protocol.grpc_service import status_for
from trtforge_runtime.protocol.grpc_tensors import decode_infer_request
from trtforge_runtime.protocol.grpc_v2 import inference_pb2 as pb
from trtforge_runtime.protocol.grpc_v2.generate import HERE, OUTPUTS, generate
from trtforge_runtime.protocol.v2 import encode_bytes_blob
from trtforge_runtime.serving.batcher import QueueFull
from trtforge_runtime.serving.body import BodyMemoryFull
from trtforge_runtime.serving.metrics import Outcome
from trtforge_runtime.serving.model import InferRequest, model_spec

from tests.unit.test_runtime import _manifest
from trtforge.contract.manifest import TensorSpec

SPEC = model_spec(_manifest(), "mlp")  # x: FP32 [-1, 4] (max batch 16); outputs y FP32 [-1, 2], s BYTES


def _fields(d: Descriptor) -> dict[str, tuple[int, int, int, str]]:
    out = {}
    for f in d.fields:
        sub = f.message_type.full_name if f.message_type is not None else ""
        out[f.name] = (f.number, f.type, int(f.is_repeated), sub)
    return out


def _walk(d: Descriptor) -> dict[str, Descriptor]:
    found = {d.full_name: d}
    for n in d.nested_types:
        found.update(_walk(n))
    return found


def test_every_message_and_method_matches_tritonclients_wire_format() -> None:
    ours = pb.DESCRIPTOR
    assert ours.package == triton_pb.DESCRIPTOR.package == "inference"
    theirs_service = triton_pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for m in ours.services_by_name["GRPCInferenceService"].methods:
        t = theirs_service.methods_by_name[m.name]
        assert (m.input_type.full_name, m.output_type.full_name) == (
            t.input_type.full_name,
            t.output_type.full_name,
        )
    checked = 0
    for top in ours.message_types_by_name.values():
        for name, d in _walk(top).items():
            theirs = triton_pb.DESCRIPTOR.pool.FindMessageTypeByName(name)
            their_fields = _fields(theirs)
            for field, spec in _fields(d).items():
                assert their_fields.get(field) == spec, (
                    f"{name}.{field}: ours {spec}, theirs {their_fields.get(field)}"
                )
                checked += 1
    assert checked > 60
    for enum in (
        *ours.enum_types_by_name.values(),
        *(e for m in ours.message_types_by_name.values() for e in m.enum_types),
    ):
        theirs_enum = triton_pb.DESCRIPTOR.pool.FindEnumTypeByName(enum.full_name)
        assert {v.name: v.number for v in enum.values}.items() <= {
            v.name: v.number for v in theirs_enum.values
        }.items(), enum.full_name


def test_shipped_stubs_are_what_the_proto_generates(tmp_path: Path) -> None:
    for fresh in generate(tmp_path):
        shipped = HERE / fresh.name
        assert fresh.name in OUTPUTS
        assert shipped.read_text() == fresh.read_text(), (
            f"{shipped} is stale: run `python -m trtforge_runtime.protocol.grpc_v2.generate`"
        )


def _request(**inputs: tuple[str, list[int], bytes | None]) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="mlp")
    for name, (datatype, shape, raw) in inputs.items():
        msg.inputs.add(name=name, datatype=datatype, shape=shape)
        if raw is not None:
            msg.raw_input_contents.append(raw)
    return msg


def test_raw_and_typed_contents_decode_and_outputs_encode_raw() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    req = decode_infer_request(_request(x=("FP32", [2, 4], x.tobytes())), SPEC)
    np.testing.assert_array_equal(req.inputs["x"], x)
    assert req.outputs == [("y", True), ("s", True)]
    typed = pb.ModelInferRequest(model_name="mlp", id="r7")
    t = typed.inputs.add(name="x", datatype="FP32", shape=[2, 4])
    t.contents.fp32_contents.extend(x.ravel().tolist())
    typed.outputs.add(name="y")
    req = decode_infer_request(typed, SPEC)
    np.testing.assert_array_equal(req.inputs["x"], x)
    assert req.outputs == [("y", True)] and req.id == "r7"

    y = np.array([[1.5, 2.5], [3.5, 4.5]], np.float32)
    resp = pb.ModelInferResponse.FromString(encode_infer_response(SPEC, req, {"y": y}))
    assert (resp.model_name, resp.id, resp.outputs[0].datatype, list(resp.outputs[0].shape)) == (
        "mlp",
        "r7",
        "FP32",
        [2, 2],
    )
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], np.float32).reshape(2, 2), y)

    text = model_spec(_manifest(inputs=[TensorSpec(name="t", dtype="str", shape=[-1])]), "text")
    blob = b"\x01\x00\x00\x00a\x02\x00\x00\x00bc"
    assert list(decode_infer_request(_request(t=("BYTES", [2], blob)), text).inputs["t"]) == [b"a", b"bc"]


def test_bad_requests_are_refused_before_decoding_with_the_right_status() -> None:
    for msg, text in [
        (_request(x=("FP32", [1000, 4], b"\0" * 16)), "exceeds the model's max batch size 16"),
        (_request(x=("FP64", [1, 4], b"\0" * 32)), "datatype FP64, expected FP32"),
        (_request(x=("FP32", [1, 4], b"\0" * 15)), "15 bytes of raw contents"),
        (_request(x=("FP32", [1, 4], None)), r"0 values in contents.fp32_contents for shape \[1, 4\]"),
        (_request(z=("FP32", [1, 4], b"")), "unknown input 'z'"),
        (_request(x=("FP16", [1, 4], None)), "datatype FP16, expected FP32"),
    ]:
        with pytest.raises(RequestError, match=text) as e:
            decode_infer_request(msg, SPEC)
        assert code_for(e.value) is Code.INVALID_ARGUMENT
    two = _request(x=("FP32", [1, 4], b"\0" * 16))
    two.raw_input_contents.append(b"")
    with pytest.raises(RequestError, match="2 entries for 1 inputs"):
        decode_infer_request(two, SPEC)
    assert code_for(QueueFull(3)) is Code.RESOURCE_EXHAUSTED
    assert code_for(BodyMemoryFull(1 << 20)) is Code.RESOURCE_EXHAUSTED
    assert code_for(RequestError(503, "loading")) is Code.UNAVAILABLE
    assert code_for(RequestError(404, "who")) is Code.NOT_FOUND
    assert code_for(RequestError(500, "boom")) is Code.INTERNAL


def _tritonclient_request(n_inputs: int, with_id: bool) -> bytes:
    """A ModelInferRequest as tritonclient.grpc builds it: several inputs, parameters, outputs."""
    msg = triton_pb.ModelInferRequest(model_name="mlp", model_version="1")
    if with_id:
        msg.id = "req-\u00e9-7"
    msg.parameters["priority"].int64_param = 3
    for i in range(n_inputs):
        t = msg.inputs.add(name=f"in{i}", datatype="FP32", shape=[1, 300 + i])
        t.parameters["p"].bool_param = True
        msg.raw_input_contents.append(np.full(300 + i, i, np.float32).tobytes())
    msg.outputs.add(name="y").parameters["binary_data"].bool_param = True
    data: bytes = msg.SerializeToString()
    return data


def _field(number: int, wire: int, payload: bytes) -> bytes:
    tag = (number << 3) | wire
    if wire == 2:
        return bytes([tag, len(payload)]) + payload  # short fields only: one-byte tag and length
    return bytes([tag]) + payload


def test_raw_contents_are_read_in_place_and_the_rest_is_what_protobuf_parses() -> None:
    assert pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number == RAW_INPUT_CONTENTS
    head = pb.ModelInferRequest(model_name="mlp", id="z")
    head.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    interleaved = (  # raw contents before, between and after the other fields; an unknown field
        _field(RAW_INPUT_CONTENTS, 2, b"A" * 16)
        + head.SerializeToString()
        + _field(99 & 0xF, 5, b"\0\0\0\0")
        + _field(RAW_INPUT_CONTENTS, 2, b"")
        + _field(RAW_INPUT_CONTENTS, 2, b"BB")
    )
    for data in [
        _tritonclient_request(1, True),
        _tritonclient_request(3, False),
        _tritonclient_request(0, False),
        b"",
        interleaved,
    ]:
        msg, raw = parse_infer_request(data)
        whole = pb.ModelInferRequest.FromString(data)
        assert [bytes(r) for r in raw] == list(whole.raw_input_contents)
        assert all(isinstance(r, memoryview) and r.obj is data for r in raw), "a copy was made"
        whole.ClearField("raw_input_contents")
        assert msg == whole


def test_a_request_the_scan_does_not_expect_is_protobufs_to_parse_or_refuse() -> None:
    # Raw contents that are not length-delimited: protobuf's call (it keeps them as an unknown field).
    odd = _field(1, 2, b"mlp") + _field(RAW_INPUT_CONTENTS, 0, b"\x05")
    msg, raw = parse_infer_request(odd)
    assert msg == pb.ModelInferRequest.FromString(odd) and msg.model_name == "mlp" and list(raw) == []
    grouped = _field(1, 2, b"mlp") + b"\x0b\x0c"  # an empty group: protobuf keeps it as unknown
    assert parse_infer_request(grouped)[0] == pb.ModelInferRequest.FromString(grouped)
    good = _tritonclient_request(1, True)
    for bad in [good[:-7], good + b"\x80", b"\x0a\x7f" + b"x", b"\x0b"]:  # cut, varint, past end, open group
        with pytest.raises(RequestError, match="does not parse") as e:
            parse_infer_request(bad)
        assert code_for(e.value) is Code.INVALID_ARGUMENT
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    msg, raw = parse_infer_request(_request(x=("FP32", [1, 4], x.tobytes())).SerializeToString())
    req = decode_infer_request(msg, SPEC, raw)
    np.testing.assert_array_equal(req.inputs["x"], x)
    with pytest.raises(RequestError, match="2 entries for 1 inputs"):
        decode_infer_request(msg, SPEC, [*raw, memoryview(b"")])


def _protobuf_response(spec_name: str, version: str, rid: str, outs: dict[str, np.ndarray]) -> bytes:
    """The same response as protobuf itself builds and serialises it (the reference)."""
    resp = pb.ModelInferResponse(model_name=spec_name, model_version=version, id=rid)
    for name, arr in outs.items():
        datatype = "BYTES" if arr.dtype == object else {"float32": "FP32", "int64": "INT64"}[arr.dtype.name]
        resp.outputs.add(name=name, datatype=datatype, shape=arr.shape)
        resp.raw_output_contents.append(
            encode_bytes_blob(arr) if datatype == "BYTES" else np.ascontiguousarray(arr).tobytes()
        )
    return resp.SerializeToString()


@pytest.mark.parametrize("rid", ["", "r7", "é" * 200])
def test_the_hand_written_response_is_protobufs_byte_for_byte(rid: str) -> None:
    rng = np.random.default_rng(3)
    outs = {
        "y": rng.standard_normal((3, 300)).astype(np.float32),  # a dimension of two varint bytes
        "n": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),  # not C-contiguous
        "s": np.array([b"a", b"bc", b""], dtype=object),
        "z": np.zeros((0, 4), np.float32),  # an empty tensor
        "k": np.float32(2.5).reshape(()),  # a scalar: no shape at all
    }
    req = InferRequest(id=rid or None, inputs={}, outputs=[(n, True) for n in outs])
    got = encode_infer_response(SPEC, req, outs)
    assert got == _protobuf_response(SPEC.name, SPEC.version, rid, outs)
    # ... and tritonclient's own descriptors read it back (a client no one here wrote).
    back = triton_pb.ModelInferResponse.FromString(got)
    assert [o.name for o in back.outputs] == list(outs) and back.id == rid
    np.testing.assert_array_equal(
        np.frombuffer(back.raw_output_contents[0], np.float32).reshape(3, 300), outs["y"]
    )
    np.testing.assert_array_equal(
        np.frombuffer(back.raw_output_contents[1], np.int64).reshape(2, 3), outs["n"]
    )


@pytest.mark.parametrize("rid", ["", "r7", "é" * 200, "x" * 300])
def test_answers_of_fixed_size_outputs_built_from_a_kept_frame_are_protobufs_byte_for_byte(rid: str) -> None:
    """The fields before the raw contents are built once per model, id and output descriptions
    (ids over 256 characters every time); each answer still carries its own outputs' bytes."""
    rng = np.random.default_rng(5)
    for _ in range(3):  # the first builds the frame, the others reuse it
        outs = {
            "y": rng.standard_normal((3, 300)).astype(np.float32),
            "n": np.asfortranarray(rng.integers(0, 99, (2, 3))),  # not C-contiguous
            "z": np.zeros((0, 4), np.float32),
            "k": np.float32(rng.standard_normal()).reshape(()),
        }
        req = InferRequest(id=rid or None, inputs={}, outputs=[(n, True) for n in outs])
        want = _protobuf_response(SPEC.name, SPEC.version, rid, outs)
        assert encode_infer_response(SPEC, req, outs) == want
    shorter = {"y": np.ones((1, 300), np.float32)}  # the same output, another shape: another frame
    req = InferRequest(id=rid or None, inputs={}, outputs=[("y", True)])
    got = encode_infer_response(SPEC, req, shorter)
    assert got == _protobuf_response(SPEC.name, SPEC.version, rid, shorter)


def test_every_status_code_is_grpcs_own_by_name_and_number() -> None:
    """The transport-neutral codes are gRPC's: grpcio's front end maps each to its StatusCode."""
    for code in Code:
        assert status_for(code) is getattr(grpc.StatusCode, code.name)
        assert grpc.StatusCode[code.name].value[0] == int(code)


def test_a_refusal_counts_under_the_same_outcome_over_both_protocols() -> None:
    """A RequestError counts by its HTTP status whichever protocol carried it (errors, the one
    mapping of refusals to HTTP statuses, gRPC codes and outcomes)."""
    assert outcome_for(QueueFull(4).status) is Outcome.UNAVAILABLE
    assert outcome_for(BodyMemoryFull(1 << 20).status) is Outcome.UNAVAILABLE
    assert outcome_for(415) is Outcome.UNSUPPORTED_ENCODING
    assert outcome_for(408) is Outcome.TIMEOUT
    assert outcome_for(500) is Outcome.ERROR and outcome_for(418) is Outcome.ERROR
    assert [code_for(RequestError(s, "x")) for s in (400, 404, 408, 413, 415, 503)] == [
        Code.INVALID_ARGUMENT,
        Code.NOT_FOUND,
        Code.DEADLINE_EXCEEDED,
        Code.RESOURCE_EXHAUSTED,
        Code.INVALID_ARGUMENT,
        Code.UNAVAILABLE,
    ]
