"""Is a file an ONNX model? A cheap structural check of the top-level protobuf framing of a
``ModelProto`` (no parse of the graph, so memory stays flat for any model size): every top-level field
is well formed and ends exactly at the end of the file, ``ir_version`` (field 1) is a small positive
number, and a ``graph`` (field 7) and an ``opset_import`` (field 8) are there. JSON, HTML, text or
random bytes fail on their first bytes."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

IR_VERSION, GRAPH, OPSET_IMPORT = 1, 7, 8
MAX_IR_VERSION = 64
MAX_FIELDS = 1 << 16  # a ModelProto has a handful of top-level fields; metadata entries add some


def _varint(f: BinaryIO) -> int | None:
    """One base-128 varint; None at a clean end of file. Raises ValueError when malformed."""
    shift = value = 0
    for i in range(10):
        b = f.read(1)
        if not b:
            if i == 0:
                return None
            raise ValueError("the file ends inside a varint")
        value |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return value
        shift += 7
    raise ValueError("a varint longer than 10 bytes")


def onnx_problem(path: Path) -> str | None:
    """Why `path` is not an ONNX model (None: its framing is one). Reads only the field headers."""
    size = path.stat().st_size
    if size == 0:
        return "the file is empty"
    seen: set[int] = set()
    ir_version = 0
    try:
        with open(path, "rb") as f:
            for _ in range(MAX_FIELDS):
                pos = f.tell()
                tag = _varint(f)
                if tag is None:
                    break
                field, wire = tag >> 3, tag & 7
                if field == 0 or wire not in (0, 1, 2, 5):
                    return (
                        f"byte {pos}: not a protobuf field (tag {tag:#x}); an ONNX model is a "
                        "ModelProto's fields"
                    )
                if wire == 0:
                    v = _varint(f)
                    if v is None:
                        raise ValueError("the file ends inside a field")
                    if field == IR_VERSION:
                        ir_version = v
                elif wire == 2:
                    n = _varint(f)
                    if n is None or f.tell() + n > size:
                        return f"byte {pos}: field {field} claims {n} bytes past the end of the file"
                    f.seek(n, 1)
                else:
                    f.seek(8 if wire == 1 else 4, 1)
                    if f.tell() > size:
                        raise ValueError("the file ends inside a field")
                seen.add(field)
            else:
                return f"more than {MAX_FIELDS} top-level fields; not a ModelProto"
    except ValueError as e:
        return f"not protobuf: {e}"
    if not 1 <= ir_version <= MAX_IR_VERSION:
        return f"no ONNX ir_version (field 1 is {ir_version or 'missing'})"
    missing = [name for fld, name in ((GRAPH, "graph"), (OPSET_IMPORT, "opset_import")) if fld not in seen]
    if missing:
        return f"a protobuf message without {' and '.join(missing)}; not an ONNX ModelProto"
    return None


GGUF_MAGIC = b"GGUF"


def gguf_problem(path: Path) -> str | None:
    """Why `path` is not a GGUF file (None: it starts with the GGUF magic)."""
    with path.open("rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        return f"it does not start with the GGUF magic {GGUF_MAGIC!r} (found {head!r})"
    return None
