"""The v2 protocol over gRPC (``inference.GRPCInferenceService``) on its own port.

It runs in the runtime's event loop, behind the same model checks, batcher, limits, metrics and
readiness as HTTP: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, and ModelInfer
with tensors as ``raw_input_contents`` (what tritonclient sends) or typed ``contents``. Outputs
always come back as ``raw_output_contents``.

Status codes: INVALID_ARGUMENT (a request the model cannot take; the message says why), NOT_FOUND
(unknown model or version), UNAVAILABLE (not ready, draining), RESOURCE_EXHAUSTED (the queue is full,
other requests hold the body-memory budget HTTP bodies share, or a message over
``--max-request-bytes``: gRPC itself refuses those), INTERNAL (execution failed).
The stubs are generated from grpc_v2/inference.proto and shipped (see grpc_v2/generate.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from grpc import aio

from trtforge import __version__
from trtforge_runtime.batcher import QueueFull
from trtforge_runtime.body import BodyMemoryFull
from trtforge_runtime.errors import RequestError
from trtforge_runtime.grpc_v2 import inference_pb2 as pb
from trtforge_runtime.grpc_v2 import inference_pb2_grpc as pb_grpc
from trtforge_runtime.model import V2_TO_NUMPY, ModelSpec
from trtforge_runtime.v2 import InferRequest, decode_bytes_blob, encode_bytes_blob, output_datatype

if TYPE_CHECKING:
    from trtforge_runtime.server import Runtime

log = logging.getLogger(__name__)

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    503: grpc.StatusCode.UNAVAILABLE,
}
_OUTCOMES = {400: "bad_request", 404: "not_found", 413: "too_large", 503: "unavailable"}

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


def status_for(e: RequestError) -> grpc.StatusCode:
    """The gRPC status of a refusal (the HTTP status it has on the REST endpoint mapped over)."""
    if isinstance(e, (QueueFull, BodyMemoryFull)):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return _CODES.get(e.status, grpc.StatusCode.INTERNAL)


# ModelInferRequest.raw_input_contents (a unit test checks the number against the descriptor).
RAW_INPUT_CONTENTS = 7


class _Unexpected(Exception):
    """The scan met something it leaves to protobuf."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
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


def _split_raw_contents(data: bytes) -> tuple[bytes, list[memoryview]]:
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


def parse_infer_request(data: bytes) -> tuple[pb.ModelInferRequest, Sequence[bytes | memoryview]]:
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
        msg = pb.ModelInferRequest.FromString(data)
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
    twice and took ~5% of the event loop at gRPC concurrency 32 (SqueezeNet)."""
    parts: list[bytes | memoryview] = []
    for tag, text in ((_MODEL_NAME, spec.name), (_MODEL_VERSION, spec.version), (_ID, req.id or "")):
        if text:  # proto3: an empty string is not written
            parts += _len_field(tag, text.encode())
    contents: list[bytes | memoryview] = []
    for name, _ in req.outputs:
        arr = results[name]
        datatype = output_datatype(arr)
        tensor = [*_len_field(_OUT_NAME, name.encode()), *_len_field(_OUT_DATATYPE, datatype.encode())]
        if arr.ndim:  # packed varints; an empty repeated field is not written
            tensor += _len_field(_OUT_SHAPE, b"".join(_encode_varint(d) for d in arr.shape))
        parts += _len_field(_OUTPUTS, b"".join(tensor))
        if datatype == "BYTES":
            data: bytes | memoryview = encode_bytes_blob(arr)
        else:
            data = np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data
        contents += _len_field(_RAW_OUTPUT_CONTENTS, data)
    return b"".join(parts + contents)


def _tensor_metadata(t: Any) -> pb.ModelMetadataResponse.TensorMetadata:
    return pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype, shape=list(t.shape))


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The servicer: a thin layer over the runtime's model, batcher and metrics."""

    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def _spec(self, name: str, version: str) -> ModelSpec:
        return self._rt.model_spec_for(name, version or None)

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._rt.not_ready_reason() is None)

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ModelReadyResponse:
        try:
            self._spec(request.name, request.version)
        except RequestError as e:
            if e.status == 404:
                await context.abort(grpc.StatusCode.NOT_FOUND, e.message)
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self._rt.not_ready_reason() is None)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="trtforge", version=__version__, extensions=[])

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: aio.ServicerContext[Any, Any]
    ) -> pb.ModelMetadataResponse:
        try:
            spec = self._spec(request.name, request.version)
        except RequestError as e:
            await context.abort(status_for(e), e.message)
        return pb.ModelMetadataResponse(
            name=spec.name,
            versions=[spec.version],
            platform=spec.platform,
            inputs=[_tensor_metadata(t) for t in spec.inputs],
            outputs=[_tensor_metadata(t) for t in spec.outputs],
        )

    async def ModelInfer(self, request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        """`request` arrives serialised and the answer leaves serialised (no deserialiser or
        serialiser is registered, see _handlers): raw contents are read in place and written once.
        The message counts against the body-memory budget HTTP bodies share until it is answered;
        gRPC has already read it, so waiting would not save memory: with the budget taken it is
        refused at once (RESOURCE_EXHAUSTED) and freed."""
        rt = self._rt
        t0 = time.perf_counter()
        rt.active += 1
        outcome = "success"
        reserved = 0
        try:
            got = rt.bodies.try_acquire(len(request))
            if got is None:
                raise BodyMemoryFull(rt.bodies.total)
            reserved = got
            msg, raw = parse_infer_request(request)
            spec = self._spec(msg.model_name, msg.model_version)
            batcher = rt.batcher
            if rt.state != "ready" or batcher is None:
                raise RequestError(503, f"model {spec.name!r} is not ready: {rt.reason}")
            if rt.has_bytes_inputs:  # BYTES elements are Python objects: decoded off the loop
                loop = asyncio.get_running_loop()
                req = await loop.run_in_executor(rt.decode_pool, decode_infer_request, msg, spec, raw)
            else:
                req = decode_infer_request(msg, spec, raw)
            rows = spec.validate(req.inputs)
            results = await batcher.enqueue(req.inputs, rows)
            return encode_infer_response(spec, req, results)
        except RequestError as e:
            outcome = _OUTCOMES.get(e.status, "error")
            await context.abort(status_for(e), e.message)
        except aio.AbortError:
            raise
        except Exception as e:
            outcome = "error"
            log.exception("inference failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"inference failed: {e}")
        finally:
            rt.bodies.release(reserved)
            rt.active -= 1
            rt.metrics.observe_request(outcome, time.perf_counter() - t0)
        raise AssertionError("unreachable: context.abort raises")


class _Registrations:
    """Stands in for a server while the generated code registers the servicer, to keep its handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, dict(handlers)


def _handlers(servicer: InferenceService) -> tuple[str, dict[str, Any]]:
    """The generated stubs' handlers for `servicer`, except that ModelInfer takes its request and
    returns its response serialised (parse_infer_request, encode_infer_response)."""
    reg = _Registrations()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, reg)
    infer = reg.handlers["ModelInfer"]  # a grpc.RpcMethodHandler: its documented attributes only
    reg.handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        infer.unary_unary, request_deserializer=None, response_serializer=None
    )
    return reg.service, reg.handlers


def grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_grpc(runtime: Runtime, host: str, port: int) -> tuple[aio.Server, int]:
    """Serve the runtime over gRPC on host:port (0: any free port); the server and its port.

    ``so_reuseport`` is off (except for the workers of ``--workers N``, which share the port on
    purpose), so a port in use is an error rather than silently shared; messages are
    limited to ``--max-request-bytes`` (gRPC answers RESOURCE_EXHAUSTED past it, after its own
    decompression); connections idle for ``--idle-timeout`` are closed.
    """
    s = runtime.s
    server = aio.server(
        options=[
            ("grpc.so_reuseport", 1 if s.reuse_port else 0),
            ("grpc.max_receive_message_length", s.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_connection_idle_ms", int(s.idle_timeout_s * 1000)),
        ],
        maximum_concurrent_rpcs=s.max_connections,
    )
    service, handlers = _handlers(InferenceService(runtime))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)
    address = grpc_address(host, port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:
        raise OSError(f"cannot listen for gRPC on {address}: {e}") from e
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address} (in use?)")
    await server.start()
    return server, bound
