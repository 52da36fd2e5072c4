"""Open Inference Protocol (v2) request and response bodies: JSON tensors and binary tensor data.

Binary tensor data extension (what ``tritonclient.http`` sends by default): the body is a JSON header
of ``Inference-Header-Content-Length`` bytes followed by the raw tensors, in input order, of those
inputs whose ``parameters.binary_data_size`` is set. Outputs asked for with
``parameters.binary_data: true`` (or all outputs, when the request's ``parameters.binary_data_output``
is true) come back the same way.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtforge_runtime.errors import RequestError
from trtforge_runtime.model import NUMPY_TO_V2, V2_TO_NUMPY, ModelSpec

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[tuple[str, bool]]  # (name, binary)


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and d >= 0 for d in raw):
        raise RequestError(
            400, f"input {name!r}: 'shape' must be a list of non-negative integers, got {raw!r}"
        )
    return tuple(raw)


def _decode_bytes_blob(blob: memoryview, name: str) -> list[bytes]:
    out: list[bytes] = []
    off, n = 0, len(blob)
    while off < n:
        if off + 4 > n:
            raise RequestError(400, f"input {name!r}: truncated BYTES element length")
        (length,) = struct.unpack_from("<I", blob, off)
        off += 4
        if off + length > n:
            raise RequestError(400, f"input {name!r}: BYTES element overruns the binary data")
        out.append(bytes(blob[off : off + length]))
        off += length
    return out


def _encode_bytes_blob(arr: np.ndarray) -> bytes:
    parts: list[bytes] = []
    for v in arr.reshape(-1):
        b = v if isinstance(v, bytes) else str(v).encode()
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def _json_bytes_value(v: Any) -> Any:
    if isinstance(v, bytes):
        try:
            return v.decode()
        except UnicodeDecodeError:
            return v.decode("latin-1")
    return v


def decode_request(body: bytes, header_length: int | None, spec: ModelSpec) -> InferRequest:
    if header_length is not None and not 0 <= header_length <= len(body):
        raise RequestError(400, f"{HEADER_LENGTH} is {header_length}, but the body has {len(body)} bytes")
    end = len(body) if header_length is None else header_length
    try:
        header = json.loads(body[:end])
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"request JSON is not valid: {e}") from e
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise RequestError(400, "request JSON must be an object with an 'inputs' list")
    view = memoryview(body)
    offset = end
    inputs: dict[str, np.ndarray] = {}
    for item in header["inputs"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(400, "each input must be an object with a 'name'")
        name = item["name"]
        if name in inputs:
            raise RequestError(400, f"input {name!r} appears twice")
        datatype = item.get("datatype")
        dtype = V2_TO_NUMPY.get(datatype) if isinstance(datatype, str) else None
        if dtype is None:
            raise RequestError(
                400, f"input {name!r}: datatype {datatype!r} is not one of {sorted(V2_TO_NUMPY)}"
            )
        shape = _shape(item.get("shape"), name)
        count = 1
        for d in shape:
            count *= d
        params = item.get("parameters") or {}
        size = params.get("binary_data_size") if isinstance(params, dict) else None
        if size is not None:
            if not isinstance(size, int) or size < 0 or offset + size > len(body):
                raise RequestError(
                    400,
                    f"input {name!r}: binary_data_size {size!r} does not fit the "
                    f"{len(body) - offset} bytes of binary data left",
                )
            blob = view[offset : offset + size]
            offset += size
            if datatype == "BYTES":
                values = _decode_bytes_blob(blob, name)
                if len(values) != count:
                    raise RequestError(
                        400, f"input {name!r}: {len(values)} BYTES elements for shape {list(shape)}"
                    )
                arr = np.empty(count, dtype=object)
                arr[:] = values
                arr = arr.reshape(shape)
            else:
                if size != count * dtype.itemsize:
                    raise RequestError(
                        400,
                        f"input {name!r}: {size} bytes of binary data, but shape "
                        f"{list(shape)} of {datatype} needs {count * dtype.itemsize}",
                    )
                arr = np.frombuffer(blob, dtype=dtype, count=count).reshape(shape)
        else:
            if "data" not in item:
                raise RequestError(400, f"input {name!r} has neither 'data' nor parameters.binary_data_size")
            try:
                if datatype == "BYTES":
                    flat = np.asarray(item["data"], dtype=object).reshape(-1)
                    arr = np.empty(flat.size, dtype=object)
                    arr[:] = [v.encode() if isinstance(v, str) else v for v in flat]
                else:
                    arr = np.asarray(item["data"], dtype=dtype)
                if arr.size != count:
                    raise RequestError(400, f"input {name!r}: {arr.size} values for shape {list(shape)}")
                arr = arr.reshape(shape)
            except (ValueError, TypeError) as e:
                raise RequestError(400, f"input {name!r}: data does not convert to {datatype}: {e}") from e
        inputs[name] = arr
    if offset != len(body):
        raise RequestError(400, f"{len(body) - offset} bytes of binary data are not claimed by any input")

    params = header.get("parameters") or {}
    default_binary = bool(params.get("binary_data_output", False)) if isinstance(params, dict) else False
    requested = header.get("outputs")
    outputs: list[tuple[str, bool]] = []
    if requested:
        if not isinstance(requested, list):
            raise RequestError(400, "'outputs' must be a list")
        known = set(spec.output_names)
        for o in requested:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise RequestError(400, "each requested output must be an object with a 'name'")
            if o["name"] not in known:
                raise RequestError(
                    400, f"unknown output {o['name']!r}; the model has {list(spec.output_names)}"
                )
            oparams = o.get("parameters") or {}
            binary = (
                oparams.get("binary_data", default_binary) if isinstance(oparams, dict) else default_binary
            )
            outputs.append((o["name"], bool(binary)))
    else:
        outputs = [(n, default_binary) for n in spec.output_names]
    rid = header.get("id")
    return InferRequest(id=str(rid) if rid is not None else None, inputs=inputs, outputs=outputs)


def encode_response(
    spec: ModelSpec, req: InferRequest, results: dict[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary outputs, the JSON header's length."""
    outs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, binary in req.outputs:
        arr = results[name]
        datatype = "BYTES" if arr.dtype.kind in "OSU" else NUMPY_TO_V2.get(arr.dtype.name, "BYTES")
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            blob = _encode_bytes_blob(arr) if datatype == "BYTES" else np.ascontiguousarray(arr).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif datatype == "BYTES":
            entry["data"] = [_json_bytes_value(v) for v in arr.reshape(-1).tolist()]
        else:
            entry["data"] = arr.reshape(-1).tolist()
        outs.append(entry)
    head: dict[str, Any] = {"model_name": spec.name, "model_version": spec.version}
    if req.id is not None:
        head["id"] = req.id
    head["outputs"] = outs
    header = json.dumps(head, separators=(",", ":")).encode()
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)
