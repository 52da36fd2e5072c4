"""ModelInfer's messages on the wire, written and read by hand where protobuf would copy tensors.

:func:`parse_infer_request` reads a serialised ModelInferRequest with its raw input contents left
as views of the message's bytes (protobuf copies each tensor twice: into the message, then into a
bytes object when it is read); everything else in the message is protobuf's to parse.
:func:`encode_infer_response` writes a ModelInferResponse field by field, each output's bytes once,
and keeps the bytes before the outputs' for answers that repeat them. Both hold byte for byte to
protobuf's own (tests/unit/test_runtime_grpc_codec.py); ``benchmarks/grpc_codec.py`` measures them
against protobuf's upb in the same run (docs/design.md, "Runtime protocols").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
from google.protobuf.message import DecodeError

from trtforge_runtime.errors import RequestError
from trtforge_runtime.protocol.grpc_v2 import inference_pb2 as pb
from trtforge_runtime.protocol.v2 import HEADER_CACHE_MAX_ID, encode_bytes_blob, output_datatype
from trtforge_runtime.serving.model import InferRequest, ModelSpec

Buffer = bytes | bytearray | memoryview  # a serialised message


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
