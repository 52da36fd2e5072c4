"""Open Inference Protocol (v2) request and response bodies: JSON tensors and binary tensor data.

Binary tensor data extension (what ``tritonclient.http`` sends by default): the body is a JSON header
of ``Inference-Header-Content-Length`` bytes followed by the raw tensors, in input order, of those
inputs whose ``parameters.binary_data_size`` is set. Outputs asked for with
``parameters.binary_data: true`` (or all outputs, when the request's ``parameters.binary_data_output``
is true) come back the same way.
"""

from __future__ import annotations

import functools
import json
import struct
import threading
from typing import Any, NamedTuple

import numpy as np

from trtforge_runtime.errors import RequestError
from trtforge_runtime.serving.model import NUMPY_TO_V2, V2_TO_NUMPY, InferRequest, ModelSpec

HEADER_LENGTH = "Inference-Header-Content-Length"


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(isinstance(d, int) and d >= 0 for d in raw):
        raise RequestError(
            400, f"input {name!r}: 'shape' must be a list of non-negative integers, got {raw!r}"
        )
    return tuple(raw)


def decode_bytes_blob(blob: memoryview, name: str, count: int) -> np.ndarray:
    """`count` length-prefixed elements filling `blob` exactly (at most `count` are ever made)."""
    arr = np.empty(count, dtype=object)
    off, n = 0, len(blob)
    for i in range(count):
        if off + 4 > n:
            raise RequestError(
                400, f"input {name!r}: {i} BYTES elements in the binary data, expected {count}"
            )
        (length,) = struct.unpack_from("<I", blob, off)
        off += 4
        if off + length > n:
            raise RequestError(400, f"input {name!r}: BYTES element {i} overruns the binary data")
        arr[i] = bytes(blob[off : off + length])
        off += length
    if off != n:
        raise RequestError(
            400, f"input {name!r}: {n - off} bytes of binary data left after its {count} BYTES elements"
        )
    return arr


def encode_bytes_blob(arr: np.ndarray) -> bytes:
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


DEFAULT_MAX_JSON_BYTES = 8 << 20
JSON_BYTES_PER_VALUE = 64  # generous: "-1.2345678901234567e-05, " plus indentation
JSON_SLACK = 64 << 10


def json_limit(spec: ModelSpec, max_json_bytes: int) -> int:
    """The most JSON bytes a request to `spec` may carry: what its largest valid request needs.

    Numbers written as JSON cost tens of bytes of Python objects each, so the JSON part is bounded by
    the model's largest valid request (when its shapes are bounded and it has no BYTES input, whose
    strings have no size bound) and by `max_json_bytes`. Large tensors belong in binary data.
    """
    n = spec.max_values
    if n is None or spec.has_bytes_inputs:
        return max_json_bytes
    return min(max_json_bytes, JSON_SLACK + JSON_BYTES_PER_VALUE * n)


def _parse_header(head: bytes | memoryview, spec: ModelSpec, max_json_bytes: int) -> Any:
    limit = json_limit(spec, max_json_bytes)
    if len(head) > limit:
        raise RequestError(
            413,
            f"the request's JSON is {len(head)} bytes; this model's requests take at most {limit} bytes "
            "of JSON (send large tensors as binary data, with Inference-Header-Content-Length)",
        )
    head = bytes(head)
    values = spec.max_values
    if values is not None and not spec.has_bytes_inputs:
        # Each value but the last of an array is followed by a comma: more commas than the model's
        # largest request has values means too many values, found without building them.
        commas = head.count(b",")
        if commas > values + 1024:
            raise RequestError(
                400,
                f"the request's JSON holds over {commas} values; the model's inputs take at most {values}",
            )
    try:
        return json.loads(head)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"request JSON is not valid: {e}") from e
    except RecursionError as e:
        raise RequestError(400, "request JSON is nested too deeply") from e


def decode_request(
    body: bytes | bytearray | memoryview,
    header_length: int | None,
    spec: ModelSpec,
    max_json_bytes: int = DEFAULT_MAX_JSON_BYTES,
) -> InferRequest:
    """Parse a v2 request body into tensors for `spec`.

    Everything the header declares (input names, datatypes, shapes, binary sizes) is checked against
    the model before any tensor data is touched, so memory use is bounded by the model's largest
    valid request, not by what the body claims. Binary tensors are views of `body`, not copies.
    """
    return _decode(body, header_length, spec, max_json_bytes)[0]


def _decode(
    body: bytes | bytearray | memoryview, header_length: int | None, spec: ModelSpec, max_json_bytes: int
) -> tuple[InferRequest, dict[str, int] | None]:
    """:func:`decode_request`, and each input's offset in `body` when every input is binary data
    of a fixed-size datatype (else None)."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise RequestError(400, f"{HEADER_LENGTH} is {header_length}, but the body has {len(body)} bytes")
    end = len(body) if header_length is None else header_length
    view = memoryview(body)
    header = _parse_header(view[:end], spec, max_json_bytes)
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise RequestError(400, "request JSON must be an object with an 'inputs' list")
    offset = end
    inputs: dict[str, np.ndarray] = {}
    offsets: dict[str, int] | None = {}
    for item in header["inputs"]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise RequestError(400, "each input must be an object with a 'name'")
        name = item["name"]
        if name in inputs:
            raise RequestError(400, f"input {name!r} appears twice")
        datatype = item.get("datatype")
        if not isinstance(datatype, str) or datatype not in V2_TO_NUMPY:
            raise RequestError(
                400, f"input {name!r}: datatype {datatype!r} is not one of {sorted(V2_TO_NUMPY)}"
            )
        dtype = V2_TO_NUMPY[datatype]
        shape = _shape(item.get("shape"), name)
        spec.check_input(name, datatype, shape)
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
                arr = decode_bytes_blob(blob, name, count).reshape(shape)
                offsets = None
            else:
                if size != count * dtype.itemsize:
                    raise RequestError(
                        400,
                        f"input {name!r}: {size} bytes of binary data, but shape "
                        f"{list(shape)} of {datatype} needs {count * dtype.itemsize}",
                    )
                arr = np.frombuffer(blob, dtype=dtype, count=count).reshape(shape)
                if offsets is not None:
                    offsets[name] = offset - size
        else:
            offsets = None
            if "data" not in item:
                raise RequestError(400, f"input {name!r} has neither 'data' nor parameters.binary_data_size")
            data = item["data"]
            if not isinstance(data, list):
                raise RequestError(400, f"input {name!r}: 'data' must be a list of values")
            try:
                if datatype == "BYTES":
                    flat = np.asarray(data, dtype=object).reshape(-1)
                    arr = np.empty(flat.size, dtype=object)
                    arr[:] = [v.encode() if isinstance(v, str) else v for v in flat]
                else:
                    arr = np.asarray(data, dtype=dtype)
            except (ValueError, TypeError, OverflowError) as e:
                raise RequestError(400, f"input {name!r}: data does not convert to {datatype}: {e}") from e
            if arr.size != count:
                raise RequestError(400, f"input {name!r}: {arr.size} values for shape {list(shape)}")
            arr = arr.reshape(shape)
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
    return InferRequest(id=str(rid) if rid is not None else None, inputs=inputs, outputs=outputs), offsets


class _Plan(NamedTuple):
    """What a binary request's JSON header decodes to, less the tensors' bytes."""

    id: str | None
    inputs: tuple[tuple[str, np.dtype, int, tuple[int, ...], int], ...]  # name, dtype, count, shape, offset
    outputs: tuple[tuple[str, bool], ...]
    rows: int


PLAN_MAX_HEADER_BYTES = 2048  # longer JSON headers are decoded every time, never kept
PLANS = 256  # distinct headers kept per model


class RequestPlans:
    """Decoded and checked v2 requests to `spec`, kept by the bytes of their JSON header.

    A client's requests repeat their JSON header (names, datatypes, shapes, binary sizes) and change
    only the tensors' bytes, so a request whose header bytes and body length were seen before is not
    parsed or checked again: its tensors are views of its own body at the offsets the first decode
    found. Only requests whose every input is binary data of a fixed-size datatype, with a header
    of at most ``PLAN_MAX_HEADER_BYTES``, are kept, at most ``PLANS`` of them (the oldest go first).
    What :meth:`decode` returns is what :func:`decode_request` and ``spec.validate`` return; a
    request they refuse is refused each time (docs/design.md, "Runtime protocols")."""

    def __init__(self, spec: ModelSpec, max_json_bytes: int = DEFAULT_MAX_JSON_BYTES) -> None:
        self.spec = spec
        self.max_json_bytes = max_json_bytes
        self._plans: dict[tuple[bytes, int], _Plan] = {}
        self._lock = threading.Lock()  # the event loop and the decode pool share it

    def __len__(self) -> int:
        return len(self._plans)

    def decode(
        self, body: bytes | bytearray | memoryview, header_length: int | None
    ) -> tuple[InferRequest, int]:
        """`body`'s request and its batch rows; RequestError when it is not valid."""
        key: tuple[bytes, int] | None = None
        if header_length is not None and 0 <= header_length <= min(len(body), PLAN_MAX_HEADER_BYTES):
            view = memoryview(body)
            key = (bytes(view[:header_length]), len(body))
            plan = self._plans.get(key)
            if plan is not None:
                inputs = {
                    name: np.frombuffer(view, dtype, count, offset).reshape(shape)
                    for name, dtype, count, shape, offset in plan.inputs
                }
                return InferRequest(plan.id, inputs, list(plan.outputs)), plan.rows
        req, offsets = _decode(body, header_length, self.spec, self.max_json_bytes)
        rows = self.spec.validate(req.inputs)
        if key is not None and offsets is not None:
            entries = tuple((n, a.dtype, a.size, a.shape, offsets[n]) for n, a in req.inputs.items())
            with self._lock:
                while len(self._plans) >= PLANS:
                    del self._plans[next(iter(self._plans))]
                self._plans[key] = _Plan(req.id, entries, tuple(req.outputs), rows)
        return req, rows


_OUTPUT_DATATYPES: dict[np.dtype, str] = {}


def output_datatype(arr: np.ndarray) -> str:
    """The v2 datatype of an output array."""
    dt = arr.dtype
    got = _OUTPUT_DATATYPES.get(dt)
    if got is None:
        if dt.kind in "OSU":  # strings: one dtype per length, not worth keeping
            return "BYTES"
        got = _OUTPUT_DATATYPES[dt] = NUMPY_TO_V2.get(dt.name, "BYTES")
    return got


HEADER_CACHE_MAX_ID = 256  # answers to requests with longer ids build their header every time


@functools.lru_cache(maxsize=PLANS)
def _binary_header(
    model: str, version: str, rid: str | None, outputs: tuple[tuple[str, str, tuple[int, ...], int], ...]
) -> bytes:
    """The JSON header of an answer whose every output (name, datatype, shape, bytes) is binary."""
    entries = [
        {"name": n, "datatype": dt, "shape": list(shape), "parameters": {"binary_data_size": size}}
        for n, dt, shape, size in outputs
    ]
    return _answer_header(model, version, rid, entries)


def _answer_header(model: str, version: str, rid: str | None, outputs: list[dict[str, Any]]) -> bytes:
    """An answer's JSON header: the model, the request's id when it had one, and its outputs."""
    head: dict[str, Any] = {"model_name": model, "model_version": version}
    if rid is not None:
        head["id"] = rid
    head["outputs"] = outputs
    return json.dumps(head, separators=(",", ":")).encode()


def _binary_answer(
    spec: ModelSpec, req: InferRequest, results: dict[str, np.ndarray]
) -> tuple[bytes, int] | None:
    """:func:`encode_response`'s answer when every output asked for is binary of a fixed-size
    datatype and the request's id is short, its header from :func:`_binary_header`; else None."""
    if not req.outputs or (req.id is not None and len(req.id) > HEADER_CACHE_MAX_ID):
        return None
    described, arrays = [], []
    for name, binary in req.outputs:
        arr = results[name]
        datatype = output_datatype(arr)
        if not binary or datatype == "BYTES":
            return None
        described.append((name, datatype, arr.shape, arr.nbytes))
        arrays.append(arr)
    header = _binary_header(spec.name, spec.version, req.id, tuple(described))
    return b"".join([header, *(np.ascontiguousarray(a).tobytes() for a in arrays)]), len(header)


def encode_response(
    spec: ModelSpec, req: InferRequest, results: dict[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary outputs, the JSON header's length."""
    answer = _binary_answer(spec, req, results)
    if answer is not None:
        return answer
    outs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, binary in req.outputs:
        arr = results[name]
        datatype = output_datatype(arr)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if binary:
            blob = encode_bytes_blob(arr) if datatype == "BYTES" else np.ascontiguousarray(arr).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif datatype == "BYTES":
            entry["data"] = [_json_bytes_value(v) for v in arr.reshape(-1).tolist()]
        else:
            entry["data"] = arr.reshape(-1).tolist()
        outs.append(entry)
    header = _answer_header(spec.name, spec.version, req.id, outs)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)
