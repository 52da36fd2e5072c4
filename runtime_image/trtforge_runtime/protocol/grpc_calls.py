"""The v2 gRPC service's calls, as grpc.aio runs them (``grpc_service``).

Each call takes its request message and gives its response message or raises :class:`CallError`
with a gRPC status :class:`Code`. ModelInfer works on the serialised bytes both ways: raw input
contents are read in place (:func:`parse_infer_request`) and the answer is written once
(:func:`encode_infer_response`); docs/design.md, "Runtime protocols". This module does not import grpc.

Status codes (the service's refusals mapped by ``errors.grpc_code``): INVALID_ARGUMENT (a request
the model cannot take; the message says why), NOT_FOUND
(unknown model or version), UNAVAILABLE (not ready, draining), RESOURCE_EXHAUSTED (the queue is full,
other requests hold the body-memory budget HTTP bodies share, or a message over
``--max-request-bytes``), INTERNAL (execution failed).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from trtforge_runtime.errors import Code, RequestError, grpc_code
from trtforge_runtime.protocol import grpc_health as health
from trtforge_runtime.protocol.grpc_v2 import inference_pb2 as pb
from trtforge_runtime.protocol.v2 import (
    HEADER_CACHE_MAX_ID,
    InferRequest,
    decode_bytes_blob,
    encode_bytes_blob,
    output_datatype,
)
from trtforge_runtime.serving.model import V2_TO_NUMPY, ModelSpec
from trtforge_runtime.serving.service import EXTENSIONS, Service

Buffer = bytes | bytearray | memoryview  # a serialised message


class CallError(Exception):
    """A call that ends with status `code` and `message` instead of a response."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# The typed field of InferTensorContents for each datatype (FP16 has none: raw contents only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


# ModelInferRequest.raw_input_contents (a unit test checks the number against the descriptor).
RAW_INPUT_CONTENTS = 7


class _Unexpected(Exception):
    """The scan met something it leaves to protobuf."""


def _varint(data: Buffer, pos: int) -> tuple[int, int]:
    value = shift = 0
    while shift < 64:
        if pos >= len(data):
            raise _Unexpected
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise _Unexpected


def _split_raw_contents(data: Buffer) -> tuple[bytes, list[memoryview]]:
    """The message's top-level fields other than raw_input_contents (re-joined, small), and the raw
    contents as views of `data`, in order."""
    view = memoryview(data)
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    pos, end = 0, len(data)
    while pos < end:
        start = pos
        tag, pos = _varint(data, pos)
        wire = tag & 7
        if wire == 2:  # length-delimited
            length, pos = _varint(data, pos)
            if pos + length > end:
                raise _Unexpected
            if tag >> 3 == RAW_INPUT_CONTENTS:
                raw.append(view[pos : pos + length])
                pos += length
                continue
            pos += length
        elif wire == 0:
            _, pos = _varint(data, pos)
        elif wire in (1, 5):  # fixed 64 / 32 bits
            pos += 8 if wire == 1 else 4
            if pos > end:
                raise _Unexpected
        else:  # groups, or no wire type at all
            raise _Unexpected
        if tag >> 3 == RAW_INPUT_CONTENTS:
            raise _Unexpected  # raw contents that are not length-delimited: protobuf says what
        rest.append(view[start:pos])
    return b"".join(rest), raw


def split_raw_contents(data: Buffer) -> tuple[bytes, list[memoryview]] | None:
    """The message's top-level fields other than raw_input_contents (its *head*, re-joined) and the
    raw contents as views of `data`; None when the scan meets what it leaves to protobuf."""
    try:
        return _split_raw_contents(data)
    except _Unexpected:
        return None


def parse_infer_request(data: Buffer) -> tuple[pb.ModelInferRequest, Sequence[bytes | memoryview]]:
    """A serialised ModelInferRequest and its raw input contents, which stay views of `data`
    (protobuf would copy each tensor twice: into the message, then into a bytes object when read).

    The rest of the message is protobuf's to parse; anything the scan of top-level fields does not
    expect is parsed by protobuf whole, so a message that protobuf refuses is refused here too
    (RequestError 400, INVALID_ARGUMENT).
    """
    try:
        head, raw = _split_raw_contents(data)
        return pb.ModelInferRequest.FromString(head), raw
    except _Unexpected:
        pass
    except DecodeError as e:
        raise RequestError(400, f"ModelInferRequest does not parse: {e}") from e
    try:
        msg = pb.ModelInferRequest.FromString(data if isinstance(data, bytes) else bytes(data))
    except DecodeError as e:
        raise RequestError(400, f"ModelInferRequest does not parse: {e}") from e
    return msg, msg.raw_input_contents


def decode_infer_request(
    msg: pb.ModelInferRequest, spec: ModelSpec, raw: Sequence[bytes | memoryview] | None = None
) -> InferRequest:
    """Tensors of a ModelInferRequest for `spec`: declarations are checked before data is touched
    (as for HTTP), raw contents become views of the message's bytes. `raw`: the raw input contents
    when they were split off the message (parse_infer_request), else the message's own."""
    if raw is None:
        raw = msg.raw_input_contents
    if raw and len(raw) != len(msg.inputs):
        raise RequestError(
            400, f"raw_input_contents has {len(raw)} entries for {len(msg.inputs)} inputs; one per input"
        )
    inputs: dict[str, np.ndarray] = {}
    for i, t in enumerate(msg.inputs):
        name, datatype = t.name, t.datatype
        if name in inputs:
            raise RequestError(400, f"input {name!r} appears twice")
        if datatype not in V2_TO_NUMPY:
            raise RequestError(
                400, f"input {name!r}: datatype {datatype!r} is not one of {sorted(V2_TO_NUMPY)}"
            )
        shape = tuple(int(d) for d in t.shape)
        if any(d < 0 for d in shape):
            raise RequestError(400, f"input {name!r}: shape {list(shape)} has a negative dimension")
        spec.check_input(name, datatype, shape)
        count = 1
        for d in shape:
            count *= d
        dtype = V2_TO_NUMPY[datatype]
        if raw:
            if t.HasField("contents"):
                raise RequestError(400, f"input {name!r} has both contents and raw_input_contents")
            blob = raw[i]
            if datatype == "BYTES":
                arr = decode_bytes_blob(memoryview(blob), name, count)
            else:
                if len(blob) != count * dtype.itemsize:
                    raise RequestError(
                        400,
                        f"input {name!r}: {len(blob)} bytes of raw contents, but shape {list(shape)} of "
                        f"{datatype} needs {count * dtype.itemsize}",
                    )
                arr = np.frombuffer(blob, dtype=dtype, count=count)
        else:
            field = CONTENTS_FIELD.get(datatype)
            if field is None:
                raise RequestError(
                    400, f"input {name!r}: {datatype} tensors travel as raw_input_contents only"
                )
            values = getattr(t.contents, field)
            if len(values) != count:
                raise RequestError(
                    400, f"input {name!r}: {len(values)} values in contents.{field} for shape {list(shape)}"
                )
            if datatype == "BYTES":
                arr = np.empty(count, dtype=object)
                arr[:] = list(values)
            else:
                try:
                    arr = np.array(values, dtype=dtype)
                except (OverflowError, ValueError) as e:
                    raise RequestError(
                        400, f"input {name!r}: contents do not convert to {datatype}: {e}"
                    ) from e
        inputs[name] = arr.reshape(shape)
    known = set(spec.output_names)
    outputs: list[tuple[str, bool]] = []
    for o in msg.outputs:
        if o.name not in known:
            raise RequestError(400, f"unknown output {o.name!r}; the model has {list(spec.output_names)}")
        outputs.append((o.name, True))
    if not outputs:
        outputs = [(n, True) for n in spec.output_names]
    return InferRequest(id=msg.id or None, inputs=inputs, outputs=outputs)


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len_field(tag: bytes, data: bytes | memoryview) -> list[bytes | memoryview]:
    """A length-delimited protobuf field (`tag` already encoded): its parts, to be joined."""
    return [tag, _encode_varint(len(data)), data]


# Tags of the ModelInferResponse fields written below (field number << 3 | 2: length-delimited).
_MODEL_NAME, _MODEL_VERSION, _ID, _OUTPUTS, _RAW_OUTPUT_CONTENTS = b"\x0a", b"\x12", b"\x1a", b"\x2a", b"\x32"
_OUT_NAME, _OUT_DATATYPE, _OUT_SHAPE = b"\x0a", b"\x12", b"\x1a"  # InferOutputTensor's


def encode_infer_response(spec: ModelSpec, req: InferRequest, results: dict[str, np.ndarray]) -> bytes:
    """The serialised ModelInferResponse with every requested output as raw contents.

    Written field by field in field-number order, as protobuf writes the message (a unit test holds
    the two byte for byte equal): building the message and then serialising it copied every output
    twice and took ~5% of the event loop at gRPC concurrency 32 (SqueezeNet). Everything but the
    outputs' bytes depends only on the model, the id and the outputs' names, datatypes and shapes:
    for fixed-size datatypes and ids of at most ``HEADER_CACHE_MAX_ID`` characters it is built once
    (:func:`_response_frame`)."""
    arrays, described = [], []
    for name, _ in req.outputs:
        arr = results[name]
        datatype = output_datatype(arr)
        if datatype == "BYTES":
            break
        arrays.append(arr)
        described.append((name, datatype, arr.shape, arr.nbytes))
    else:
        if req.id is None or len(req.id) <= HEADER_CACHE_MAX_ID:
            head, lengths = _response_frame(spec.name, spec.version, req.id, tuple(described))
            parts: list[bytes | memoryview] = [head]
            for length, arr in zip(lengths, arrays, strict=True):
                parts += (length, np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
            return b"".join(parts)
    return b"".join(_response_parts(spec.name, spec.version, req.id, req.outputs, results))


@functools.lru_cache(maxsize=256)
def _response_frame(
    model: str, version: str, rid: str | None, outputs: tuple[tuple[str, str, tuple[int, ...], int], ...]
) -> tuple[bytes, tuple[bytes, ...]]:
    """A ModelInferResponse's bytes before its raw output contents, and each raw content's tag and
    length, for outputs of fixed-size datatypes (name, datatype, shape, bytes)."""
    head = b"".join(_response_parts(model, version, rid, [(n, True) for n, *_ in outputs], {}, outputs))
    lengths = tuple(_RAW_OUTPUT_CONTENTS + _encode_varint(size) for *_, size in outputs)
    return head, lengths


def _response_parts(
    model: str,
    version: str,
    rid: str | None,
    requested: Sequence[tuple[str, bool]],
    results: dict[str, np.ndarray],
    described: tuple[tuple[str, str, tuple[int, ...], int], ...] | None = None,
) -> list[bytes | memoryview]:
    """The response's fields in order; with `described`, the outputs' descriptions come from it and
    the raw contents are left out."""
    parts: list[bytes | memoryview] = []
    for tag, text in ((_MODEL_NAME, model), (_MODEL_VERSION, version), (_ID, rid or "")):
        if text:  # proto3: an empty string is not written
            parts += _len_field(tag, text.encode())
    contents: list[bytes | memoryview] = []
    for i, (name, _) in enumerate(requested):
        if described is not None:
            _, datatype, shape, _ = described[i]
        else:
            arr = results[name]
            datatype, shape = output_datatype(arr), arr.shape
        tensor = [*_len_field(_OUT_NAME, name.encode()), *_len_field(_OUT_DATATYPE, datatype.encode())]
        if shape:  # packed varints; an empty repeated field is not written
            tensor += _len_field(_OUT_SHAPE, b"".join(_encode_varint(d) for d in shape))
        parts += _len_field(_OUTPUTS, b"".join(tensor))
        if described is not None:
            continue
        if datatype == "BYTES":
            data: bytes | memoryview = encode_bytes_blob(arr)
        else:
            data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
        contents += _len_field(_RAW_OUTPUT_CONTENTS, data)
    return parts + contents


def _tensor_metadata(t: Any) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=list(t.shape))


# --- the calls other than ModelInfer: a request message in, a response message out -----------------
def _spec(rt: Service, name: str, version: str) -> ModelSpec:
    try:
        return rt.model_spec_for(name, version or None)
    except RequestError as e:
        raise CallError(grpc_code(e), e.message) from e


def server_live(rt: Service, request: pb.ServerLiveRequest) -> pb.ServerLiveResponse:
    return pb.ServerLiveResponse(live=True)


def server_ready(rt: Service, request: pb.ServerReadyRequest) -> pb.ServerReadyResponse:
    return pb.ServerReadyResponse(ready=rt.not_ready_reason() is None)


def model_ready(rt: Service, request: pb.ModelReadyRequest) -> pb.ModelReadyResponse:
    """NOT_FOUND for a model this server does not serve; otherwise whether it is ready."""
    try:
        return pb.ModelReadyResponse(ready=rt.model_ready(request.name, request.version or None) is None)
    except RequestError as e:
        raise CallError(grpc_code(e), e.message) from e


def server_metadata(rt: Service, request: pb.ServerMetadataRequest) -> pb.ServerMetadataResponse:
    meta = rt.server_metadata()
    return pb.ServerMetadataResponse(
        name=str(meta["name"]), version=str(meta["version"]), extensions=list(EXTENSIONS)
    )


def model_metadata(rt: Service, request: pb.ModelMetadataRequest) -> pb.ModelMetadataResponse:
    spec = _spec(rt, request.name, request.version)
    return pb.ModelMetadataResponse(
        name=spec.name,
        versions=[spec.version],
        platform=spec.platform,
        inputs=[_tensor_metadata(t) for t in spec.inputs],
        outputs=[_tensor_metadata(t) for t in spec.outputs],
    )


def model_config(rt: Service, request: pb.ModelConfigRequest) -> pb.ModelConfigResponse:
    """Triton's model-configuration extension: the configuration HTTP's ``.../config`` answers."""
    try:
        config = rt.config_for(request.name, request.version or None)
    except RequestError as e:
        raise CallError(grpc_code(e), e.message) from e
    return json_format.ParseDict({"config": config}, pb.ModelConfigResponse())


SERVICE = "inference.GRPCInferenceService"
# The health check's names whose status is the runtime's readiness: a probe's default, and this service.
READINESS_NAMES = ("", SERVICE)


def health_check(rt: Service, data: Buffer) -> bytes:
    """``grpc.health.v1.Health/Check`` (:mod:`~trtforge_runtime.protocol.grpc_health`), serialised both ways:
    NOT_FOUND for a service this server does not know."""
    try:
        service = health.parse_request(data)
    except DecodeError as e:
        raise CallError(Code.INVALID_ARGUMENT, f"HealthCheckRequest does not parse: {e}") from e
    status = health.status_for(service, rt.not_ready_reason() is None, READINESS_NAMES)
    if status is None:
        known = ", ".join(repr(s) for s in (*READINESS_NAMES, health.LIVENESS))
        raise CallError(Code.NOT_FOUND, f"unknown service {service!r}: this server answers for {known}")
    return health.encode_response(status)
