"""The gRPC ModelInfer codec: the runtime's hand-written wire code against protobuf's own (upb), same run.

For a SqueezeNet-sized and a ResNet-50-sized request (one FP32 [1, 3, 224, 224] input as
``raw_input_contents``, as tritonclient sends it) and response (their FP32 outputs as
``raw_output_contents``) it times, in one process, one after the other:

- decode: the serialised request to the tensors the batcher takes (``parse_infer_request`` then
  ``decode_infer_request``), against ``ModelInferRequest.FromString`` then ``decode_infer_request``;
- encode: the outputs to the serialised response (``encode_infer_response``), against building a
  ``ModelInferResponse`` and ``SerializeToString``.

Each figure is the median over ``--repeats`` runs of ``--number`` calls. The hand codec stays only
while it is at least 5% faster (decode plus encode) for both models (docs/design.md, "Runtime
protocols")::

    python -m benchmarks.grpc_codec   # writes benchmarks/results/grpc_codec.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common import RESULTS

# Per model: the output's shape per row (benchmarks/models.py serves the same ONNX files).
MODELS = {"squeezenet": (1000, 1, 1), "resnet50": (1000,)}
INPUT_SHAPE = (1, 3, 224, 224)
KEEP_AT = 0.95  # the hand codec stays at or under this fraction of protobuf's time


def _spec(name: str, out_shape: tuple[int, ...]) -> Any:
    from trtforge_runtime.serving.model import ModelSpec, TensorInfo

    f32 = np.dtype(np.float32)
    return ModelSpec(
        name=name,
        version="1",
        platform="onnxruntime_onnx",
        inputs=(TensorInfo("data", f32, "FP32", (-1, *INPUT_SHAPE[1:])),),
        outputs=(TensorInfo("prob", f32, "FP32", (-1, *out_shape)),),
        max_batch=8,
    )


def _time(fn: Callable[[], object], number: int, repeats: int) -> float:
    """Median seconds per call of `fn` over `repeats` runs of `number` calls."""
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t) / number)
    return statistics.median(runs)


def measure(name: str, out_shape: tuple[int, ...], number: int, repeats: int) -> dict[str, Any]:
    from trtforge_runtime.protocol import grpc_codec as codec
    from trtforge_runtime.protocol.grpc_tensors import decode_infer_request
    from trtforge_runtime.protocol.grpc_v2 import inference_pb2 as pb
    from trtforge_runtime.protocol.v2 import output_datatype

    spec = _spec(name, out_shape)
    x = np.random.default_rng(0).random(INPUT_SHAPE, dtype=np.float32)
    msg = pb.ModelInferRequest(model_name=name, id="42")
    msg.inputs.add(name="data", datatype="FP32", shape=list(INPUT_SHAPE))
    msg.outputs.add(name="prob")
    msg.raw_input_contents.append(x.tobytes())
    wire = msg.SerializeToString()
    y = np.random.default_rng(1).random((1, *out_shape), dtype=np.float32)
    req = decode_infer_request(msg, spec)

    def decode_hand() -> object:
        m, raw = codec.parse_infer_request(wire)
        return decode_infer_request(m, spec, raw)

    def decode_protobuf() -> object:
        return decode_infer_request(pb.ModelInferRequest.FromString(wire), spec)

    def encode_hand() -> bytes:
        return codec.encode_infer_response(spec, req, {"prob": y})

    def encode_protobuf() -> bytes:
        r = pb.ModelInferResponse(model_name=spec.name, model_version=spec.version, id=req.id or "")
        for out, _ in req.outputs:
            arr = np.ascontiguousarray({"prob": y}[out])
            r.outputs.add(name=out, datatype=output_datatype(arr), shape=arr.shape)
            r.raw_output_contents.append(arr.tobytes())
        return r.SerializeToString()

    assert encode_hand() == encode_protobuf(), "the two encoders disagree"
    np.testing.assert_array_equal(decode_hand().inputs["data"], decode_protobuf().inputs["data"])  # type: ignore[attr-defined]
    t = {
        fn.__name__: _time(fn, number, repeats)
        for fn in (decode_hand, decode_protobuf, encode_hand, encode_protobuf)
    }
    hand = t["decode_hand"] + t["encode_hand"]
    theirs = t["decode_protobuf"] + t["encode_protobuf"]
    return {
        "model": name,
        "request_bytes": len(wire),
        "response_bytes": len(encode_hand()),
        "us": {k: round(v * 1e6, 2) for k, v in t.items()},
        "hand_over_protobuf": round(hand / theirs, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--number", type=int, default=2000, help="calls per run")
    ap.add_argument("--repeats", type=int, default=7, help="runs; the median is reported")
    ap.add_argument("--out", default=str(RESULTS / "grpc_codec.json"))
    args = ap.parse_args(argv)
    from google.protobuf.internal import api_implementation

    rows = [measure(n, s, args.number, args.repeats) for n, s in MODELS.items()]
    keep = all(r["hand_over_protobuf"] <= KEEP_AT for r in rows)
    result = {
        "benchmark": "grpc_codec",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "protobuf_backend": api_implementation.Type(),
        "number": args.number,
        "repeats": args.repeats,
        "rows": rows,
        "keep_hand_codec": keep,
    }
    for r in rows:
        us = r["us"]
        print(
            f"{r['model']:>10}: decode {us['decode_hand']:8.2f} us hand, {us['decode_protobuf']:8.2f} us "
            f"protobuf; encode {us['encode_hand']:6.2f} us hand, {us['encode_protobuf']:6.2f} us protobuf; "
            f"hand/protobuf {r['hand_over_protobuf']:.3f}"
        )
    print(f"keep the hand codec (<= {KEEP_AT} of protobuf's time for both): {keep}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
