"""Streaming checks of a model's declared format, fed the bytes of an upload as they arrive. Pure.

The broker stores only bytes that are what the verification declared (docs/security.md): an ONNX
``ModelProto``, a safetensors file or a GGUF file. Each checker takes the body in chunks
(:meth:`FormatCheck.feed`) and holds only a few bytes of framing, never the body; :meth:`finish` says
whether the whole body was one well-formed file. A :class:`FormatError` names the byte offset, the
field and what was expected.

- ONNX: a walk of the protobuf wire format against ModelProto's schema (field numbers from onnx.proto),
  every length-delimited field bounded (names, doc strings, unknown fields), tensor data bounded only
  by its message; required fields present (ir_version, opset_import, a graph with a node and an
  output); a raw tensor's byte count consistent with its dims and data type. The ``onnx`` package
  parses only a whole message in memory (``onnx.load`` / ``ModelProto.ParseFromString``), which would
  mean holding an untrusted upload of up to ``max_bytes``, so this walk is our own.
- safetensors: the 8-byte little-endian header length (bounded), the JSON header (dtype, shape,
  data_offsets of each tensor), and offsets that tile the body exactly. The ``safetensors`` package
  reads a whole file from disk (mmap), not a stream, and is no dependency of the broker.
- GGUF: the magic, a version this format has (2 or 3) and bounded tensor and key-value counts. The
  ``gguf`` package reads a whole file from disk as well.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class ModelFormat(StrEnum):
    ONNX = "onnx"
    SAFETENSORS = "safetensors"
    GGUF = "gguf"


class FormatError(ValueError):
    """The bytes are not a well-formed file of the declared format."""


class FormatCheck(Protocol):
    def feed(self, chunk: bytes) -> None:
        """Take the next bytes; raises FormatError as soon as they cannot be the declared format."""
        ...

    def finish(self) -> None:
        """The body ended here; raises FormatError unless it was one complete, well-formed file."""
        ...


def checker(fmt: ModelFormat | str) -> FormatCheck:
    """A fresh streaming checker for `fmt`."""
    f = ModelFormat(fmt)
    if f is ModelFormat.SAFETENSORS:
        return SafetensorsCheck()
    if f is ModelFormat.GGUF:
        return GGUFCheck()
    return OnnxCheck()


def check_bytes(fmt: ModelFormat | str, data: bytes, chunk: int = 1 << 16) -> None:
    """Check a whole body, fed in chunks of `chunk` bytes (what the broker's stream does)."""
    c = checker(fmt)
    for i in range(0, len(data), chunk):
        c.feed(data[i : i + chunk])
    c.finish()


# --------------------------------------------------------------------------------------------- ONNX

NAME_MAX = 64 << 10  # a name, domain, op type, producer or metadata key
DOC_MAX = 1 << 20  # a doc string or metadata value
OPAQUE_MAX = 1 << 20  # a message walked as bytes (TypeProto, TensorAnnotation, ...)
UNKNOWN_MAX = 64 << 10  # a field this schema does not know (a newer onnx.proto)
DIMS_MAX = 4 << 10  # packed TensorProto.dims
MAX_DEPTH = 64  # nested messages (subgraphs of If/Loop nest graphs in attributes)

VARINT, I64, LEN, I32 = 0, 1, 2, 5
UNBOUNDED = -1  # bounded only by the enclosing message (tensor data)


@dataclass(frozen=True)
class F:
    """One field of a message: its name, what it holds, its bound (bytes, for length-delimited data)."""

    name: str
    kind: str  # "msg" | "bytes" | "varint" | "i32" | "i64"
    bound: int = UNBOUNDED
    child: str = ""  # the message type, for "msg"


def _s(name: str, bound: int = NAME_MAX) -> F:
    return F(name, "bytes", bound)


def _m(name: str, child: str, bound: int = UNBOUNDED) -> F:
    return F(name, "msg", bound, child)


_MAP = {1: _s("key"), 2: _s("value", DOC_MAX)}
_META = _m("metadata_props", "StringStringEntryProto", DOC_MAX + NAME_MAX + 16)

# Field numbers and types from onnx.proto (onnx/onnx.in.proto).
SCHEMA: dict[str, dict[int, F]] = {
    "ModelProto": {
        1: F("ir_version", "varint"),
        8: _m("opset_import", "OperatorSetIdProto", NAME_MAX + 16),
        2: _s("producer_name"),
        3: _s("producer_version"),
        4: _s("domain"),
        5: F("model_version", "varint"),
        6: _s("doc_string", DOC_MAX),
        7: _m("graph", "GraphProto"),
        14: _META,
        20: _m("training_info", "TrainingInfoProto"),
        25: _m("functions", "FunctionProto"),
        26: _s("configuration", OPAQUE_MAX),
    },
    "OperatorSetIdProto": {1: _s("domain"), 2: F("version", "varint")},
    "StringStringEntryProto": _MAP,
    "GraphProto": {
        1: _m("node", "NodeProto"),
        2: _s("name"),
        5: _m("initializer", "TensorProto"),
        15: _m("sparse_initializer", "SparseTensorProto"),
        10: _s("doc_string", DOC_MAX),
        11: _m("input", "ValueInfoProto", OPAQUE_MAX),
        12: _m("output", "ValueInfoProto", OPAQUE_MAX),
        13: _m("value_info", "ValueInfoProto", OPAQUE_MAX),
        14: _s("quantization_annotation", OPAQUE_MAX),
        16: _META,
    },
    "NodeProto": {
        1: _s("input"),
        2: _s("output"),
        3: _s("name"),
        4: _s("op_type"),
        7: _s("domain"),
        8: _s("overload"),
        5: _m("attribute", "AttributeProto"),
        6: _s("doc_string", DOC_MAX),
        9: _META,
        10: _s("device_configurations", OPAQUE_MAX),
    },
    "AttributeProto": {
        1: _s("name"),
        21: _s("ref_attr_name"),
        13: _s("doc_string", DOC_MAX),
        20: F("type", "varint"),
        2: F("f", "i32"),
        3: F("i", "varint"),
        4: _s("s", UNBOUNDED),
        5: _m("t", "TensorProto"),
        6: _m("g", "GraphProto"),
        22: _m("sparse_tensor", "SparseTensorProto"),
        14: _s("tp", OPAQUE_MAX),
        7: F("floats", "i32"),
        8: F("ints", "varint"),
        9: _s("strings", UNBOUNDED),
        10: _m("tensors", "TensorProto"),
        11: _m("graphs", "GraphProto"),
        23: _m("sparse_tensors", "SparseTensorProto"),
        15: _s("type_protos", OPAQUE_MAX),
    },
    "TensorProto": {
        1: F("dims", "varint"),
        2: F("data_type", "varint"),
        3: _s("segment", 64),
        4: F("float_data", "i32"),
        5: F("int32_data", "varint"),
        6: _s("string_data", UNBOUNDED),
        7: F("int64_data", "varint"),
        8: _s("name"),
        12: _s("doc_string", DOC_MAX),
        9: _s("raw_data", UNBOUNDED),
        13: _m("external_data", "StringStringEntryProto", DOC_MAX + NAME_MAX + 16),
        14: F("data_location", "varint"),
        10: F("double_data", "i64"),
        11: F("uint64_data", "varint"),
        16: _META,
    },
    "SparseTensorProto": {
        1: _m("values", "TensorProto"),
        2: _m("indices", "TensorProto"),
        3: F("dims", "varint"),
    },
    "ValueInfoProto": {1: _s("name"), 2: _s("type", OPAQUE_MAX), 3: _s("doc_string", DOC_MAX), 4: _META},
    "TrainingInfoProto": {
        1: _m("initialization", "GraphProto"),
        2: _m("algorithm", "GraphProto"),
        3: _m("initialization_binding", "StringStringEntryProto", DOC_MAX + NAME_MAX + 16),
        4: _m("update_binding", "StringStringEntryProto", DOC_MAX + NAME_MAX + 16),
    },
    "FunctionProto": {
        1: _s("name"),
        4: _s("input"),
        5: _s("output"),
        6: _s("attribute"),
        11: _m("attribute_proto", "AttributeProto"),
        7: _m("node", "NodeProto"),
        8: _s("doc_string", DOC_MAX),
        9: _m("opset_import", "OperatorSetIdProto", NAME_MAX + 16),
        10: _s("domain"),
        13: _s("overload"),
        12: _m("value_info", "ValueInfoProto", OPAQUE_MAX),
        14: _META,
    },
}
# Fields a message must have (by number), checked when it ends.
REQUIRED: dict[str, tuple[int, ...]] = {
    "ModelProto": (1, 7, 8),
    "NodeProto": (4,),
}
MAIN_GRAPH_REQUIRED = (1, 12)  # the model's graph has a node and an output
# Bytes per element of TensorProto.DataType (0: no fixed size: strings, or sub-byte types).
ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8}
ELEMENT_BYTES |= {15: 16, 16: 2, 17: 1, 18: 1, 19: 1, 20: 1}
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


@dataclass
class _Frame:
    msg: str
    end: int  # absolute offset where this message ends (-1: the end of the body)
    main_graph: bool = False
    seen: dict[int, int] = field(default_factory=dict)
    dims: list[int] = field(default_factory=list)
    data_type: int = 0
    raw_len: int = -1
    location: int = 0


def _varint(buf: bytes | bytearray | memoryview, i: int) -> tuple[int, int] | None:
    """(value, next index), or None when `buf` ends inside the varint. Raises on a varint of 11+ bytes."""
    value, shift = 0, 0
    for j in range(i, min(len(buf), i + 10)):
        b = buf[j]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, j + 1
        shift += 7
    if len(buf) - i >= 10:
        raise FormatError("a varint is longer than 10 bytes")
    return None


class OnnxCheck:
    """A push parser of ModelProto's wire format that skips data without keeping it."""

    def __init__(self) -> None:
        self.pos = 0  # bytes consumed
        self.pending = b""  # an incomplete field header (at most 20 bytes)
        self.skip = 0  # bytes of a length-delimited field still to pass
        self.capture: bytearray | None = None  # packed dims being read
        self.capture_left = 0
        self.stack = [_Frame("ModelProto", -1)]

    def _fail(self, what: str) -> FormatError:
        path = ".".join(f.msg for f in self.stack)
        return FormatError(f"not an ONNX model: at byte {self.pos}, in {path}: {what}")

    def feed(self, chunk: bytes) -> None:
        data = memoryview(self.pending + bytes(chunk)) if self.pending else memoryview(chunk)
        i, n = 0, len(data)
        while True:
            if self.skip:
                take = min(self.skip, n - i)
                if self.capture is not None:
                    self.capture += data[i : i + take]
                i += take
                self.pos += take
                self.skip -= take
                if self.skip:
                    break
                if self.capture is not None:
                    self._end_capture()
            self._close_frames()
            if i >= n:
                break
            header = self._header(data, i)
            if header is None:
                break
            i = header
        self.pending = bytes(data[i:])

    def _close_frames(self) -> None:
        while len(self.stack) > 1 and self.stack[-1].end == self.pos:
            self._close(self.stack.pop())

    def _close(self, fr: _Frame) -> None:
        missing = [n for n in REQUIRED.get(fr.msg, ()) if not fr.seen.get(n)]
        if fr.main_graph:
            missing += [n for n in MAIN_GRAPH_REQUIRED if not fr.seen.get(n)]
        if missing:
            names = ", ".join(SCHEMA[fr.msg][n].name for n in missing)
            raise self._fail(f"{fr.msg} ends without {names}")
        if fr.msg == "TensorProto" and fr.raw_len >= 0 and fr.location != EXTERNAL:
            size = ELEMENT_BYTES.get(fr.data_type, 0)
            if size and fr.dims and any(d < 0 for d in fr.dims):
                raise self._fail(f"a tensor has negative dims {fr.dims}")
            if size and math.prod(fr.dims) * size != fr.raw_len:
                raise self._fail(
                    f"a tensor's raw_data is {fr.raw_len} bytes, but dims {fr.dims} of data type "
                    f"{fr.data_type} take {math.prod(fr.dims) * size}"
                )

    def _header(self, data: memoryview, i: int) -> int | None:
        """Parse one field header at `i`; the index after it, or None when it is not all here."""
        top = self.stack[-1]
        tag = _varint(data, i)
        if tag is None:
            return None
        key, j = tag
        number, wire = key >> 3, key & 7
        if number == 0 or wire not in (VARINT, I64, LEN, I32):
            raise self._fail(
                f"field number {number} with wire type {wire} is not protobuf this schema allows"
            )
        spec = SCHEMA[top.msg].get(number)
        value = 0
        if wire == VARINT:
            v = _varint(data, j)
            if v is None:
                return None
            value, j = v
        elif wire in (I64, I32):
            width = 8 if wire == I64 else 4
            if len(data) - j < width:
                return None
            j += width
        else:
            v = _varint(data, j)
            if v is None:
                return None
            value, j = v
        self.pos += j - i
        if 0 <= top.end < self.pos:
            raise self._fail(f"field {number} runs past the end of its message")
        top.seen[number] = top.seen.get(number, 0) + 1
        name = spec.name if spec else f"field {number}"
        if spec is None:
            if wire == LEN:
                self._bounded_len(name, value, UNKNOWN_MAX)
                self.skip = value
            return j
        want = {"msg": (LEN,), "bytes": (LEN,), "varint": (VARINT, LEN), "i32": (I32, LEN), "i64": (I64, LEN)}
        if wire not in want[spec.kind]:
            raise self._fail(f"{top.msg}.{name} has wire type {wire}, not {want[spec.kind][0]}")
        if wire == VARINT and top.msg == "TensorProto":
            if number == 1:
                top.dims.append(value - (1 << 64) if value >= 1 << 63 else value)
            elif number == 2:
                top.data_type = value
            elif number == 14:
                top.location = value
        if wire != LEN:
            return j
        bound = spec.bound if spec.kind != "varint" or top.msg != "TensorProto" or number != 1 else DIMS_MAX
        self._bounded_len(f"{top.msg}.{name}", value, bound)
        if spec.kind == "msg":
            if len(self.stack) >= MAX_DEPTH:
                raise self._fail(f"messages nest deeper than {MAX_DEPTH}")
            main = top.msg == "ModelProto" and number == 7
            if main and top.seen[number] > 1:
                raise self._fail("ModelProto has more than one graph")
            self.stack.append(_Frame(spec.child, self.pos + value, main_graph=main))
            return j
        if top.msg == "TensorProto" and number == 9:
            top.raw_len = value
        if top.msg == "TensorProto" and number == 1:
            self.capture, self.capture_left = bytearray(), value
        self.skip = value
        if not value and self.capture is not None:
            self._end_capture()
        return j

    def _bounded_len(self, name: str, length: int, bound: int) -> None:
        end = self.stack[-1].end
        if end >= 0 and self.pos + length > end:
            raise self._fail(f"{name} claims {length} bytes, past the end of its message")
        if bound != UNBOUNDED and length > bound:
            raise self._fail(f"{name} is {length} bytes, more than {bound}")

    def _end_capture(self) -> None:
        buf, self.capture = self.capture or bytearray(), None
        i = 0
        while i < len(buf):
            v = _varint(buf, i)
            if v is None:
                raise self._fail("packed TensorProto.dims end inside a varint")
            value, i = v
            self.stack[-1].dims.append(value - (1 << 64) if value >= 1 << 63 else value)

    def finish(self) -> None:
        if self.pending or self.skip:
            raise self._fail("the body ends inside a field")
        if len(self.stack) > 1:
            raise self._fail(f"the body ends inside {self.stack[-1].msg}")
        self._close(self.stack[0])


# ---------------------------------------------------------------------------------------- safetensors

SAFETENSORS_HEADER_MAX = 16 << 20  # the JSON header (the safetensors library allows up to 100 MB)
# Bits per element of each safetensors dtype (safetensors' Dtype).
SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
    "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64,
}  # fmt: skip


class SafetensorsCheck:
    """The header of a safetensors file, and a body exactly as long as its offsets say."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.header_len = -1
        self.body_len = -1  # what the header's offsets cover
        self.body_seen = 0

    def feed(self, chunk: bytes) -> None:
        if self.body_len >= 0:
            self._body(len(chunk))
            return
        self.head += chunk
        if self.header_len < 0 and len(self.head) >= 8:
            (self.header_len,) = struct.unpack("<Q", self.head[:8])
            if self.header_len > SAFETENSORS_HEADER_MAX:
                raise FormatError(
                    f"not a safetensors file: its header claims {self.header_len} bytes, more than "
                    f"{SAFETENSORS_HEADER_MAX}"
                )
        if self.header_len >= 0 and len(self.head) >= 8 + self.header_len:
            rest = len(self.head) - 8 - self.header_len
            self.body_len = safetensors_body_length(bytes(self.head[8 : 8 + self.header_len]))
            self.head = bytearray()
            self._body(rest)

    def _body(self, n: int) -> None:
        self.body_seen += n
        if self.body_seen > self.body_len:
            raise FormatError(
                f"not a safetensors file: more than the {self.body_len} data bytes its header describes"
            )

    def finish(self) -> None:
        if self.body_len < 0:
            raise FormatError("not a safetensors file: the body ends inside the 8-byte length or the header")
        if self.body_seen != self.body_len:
            raise FormatError(
                f"not a safetensors file: {self.body_seen} data bytes, but its header describes "
                f"{self.body_len}"
            )


def safetensors_body_length(header: bytes) -> int:
    """The data length a safetensors JSON header describes; FormatError unless its tensors tile
    [0, length) exactly, each as long as its dtype and shape say."""
    try:
        doc = json.loads(header.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError(f"not a safetensors file: its header is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise FormatError("not a safetensors file: its header is not a JSON object")
    spans: list[tuple[int, int, str]] = []
    for name, t in doc.items():
        if name == "__metadata__":
            if not isinstance(t, dict) or not all(isinstance(v, str) for v in t.values()):
                raise FormatError("not a safetensors file: __metadata__ is not an object of strings")
            continue
        where = f"not a safetensors file: tensor {name!r}"
        if not isinstance(t, dict) or set(t) != {"dtype", "shape", "data_offsets"}:
            raise FormatError(f"{where} is not {{dtype, shape, data_offsets}}")
        bits = SAFETENSORS_BITS.get(t["dtype"]) if isinstance(t["dtype"], str) else None
        shape, offs = t["shape"], t["data_offsets"]
        if bits is None:
            raise FormatError(f"{where} has dtype {t['dtype']!r}, not one of {sorted(SAFETENSORS_BITS)}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise FormatError(f"{where} has shape {shape!r}, not a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int and o >= 0 for o in offs)):
            raise FormatError(f"{where} has data_offsets {offs!r}, not [begin, end]")
        elems = math.prod(shape)
        if (elems * bits) % 8 or offs[1] - offs[0] != elems * bits // 8:
            raise FormatError(
                f"{where} spans bytes {offs[0]}..{offs[1]}, but {t['dtype']} {shape} takes {elems * bits / 8}"
            )
        spans.append((offs[0], offs[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise FormatError(f"not a safetensors file: tensor {name!r} begins at {begin}, not {end}")
        end = stop
    return end


# ---------------------------------------------------------------------------------------------- GGUF

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_COUNT_MAX = 1 << 20  # tensors, and key-value pairs, of one file


class GGUFCheck:
    """GGUF's fixed header: magic, version, tensor and key-value counts (llama.cpp's gguf.h)."""

    HEADER = 4 + 4 + 8 + 8

    def __init__(self) -> None:
        self.head = bytearray()
        self.size = 0

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if len(self.head) >= self.HEADER:
            return
        self.head += chunk[: self.HEADER - len(self.head)]
        if len(self.head) >= 4 and self.head[:4] != GGUF_MAGIC:
            raise FormatError(f"not a GGUF file: it begins {bytes(self.head[:4])!r}, not {GGUF_MAGIC!r}")
        if len(self.head) < self.HEADER:
            return
        version, tensors, kvs = struct.unpack("<IQQ", self.head[4 : self.HEADER])
        if version not in GGUF_VERSIONS:
            raise FormatError(f"not a GGUF file this reads: version {version}, not one of {GGUF_VERSIONS}")
        for what, n in (("tensors", tensors), ("key-value pairs", kvs)):
            if n > GGUF_COUNT_MAX:
                raise FormatError(f"not a GGUF file: it claims {n} {what}, more than {GGUF_COUNT_MAX}")

    def finish(self) -> None:
        if len(self.head) < self.HEADER:
            raise FormatError(
                f"not a GGUF file: {self.size} bytes, shorter than its {self.HEADER}-byte header"
            )
