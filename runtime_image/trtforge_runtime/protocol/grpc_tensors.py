"""A ModelInferRequest's tensors for the served model: the gRPC counterpart of ``v2``'s decode.

Each input's name, datatype and shape are checked against the model before its data is touched (as
for HTTP); raw contents become views of the message's bytes, typed contents are converted
(docs/design.md, "Runtime request limits").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trtforge_runtime.errors import RequestError
from trtforge_runtime.protocol.grpc_v2 import inference_pb2 as pb
from trtforge_runtime.protocol.v2 import decode_bytes_blob
from trtforge_runtime.serving.model import V2_TO_NUMPY, InferRequest, ModelSpec

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
