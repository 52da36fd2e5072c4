"""The v2 gRPC service's calls, as grpc.aio runs them (``grpc_service``); this module does not import
grpc.

ModelInfer is a :class:`GrpcInfer`, the service pipeline's ``Wire``: its serialised bytes are read
with the raw input contents in place and its answer is written once (``grpc_codec``). Every other
call takes its request message and gives its response message or raises :class:`CallError` with a
gRPC status :class:`Code`.

Status codes (the service's refusals mapped by ``errors.grpc_code``): INVALID_ARGUMENT (a request
the model cannot take; the message says why), NOT_FOUND (unknown model or version), UNAVAILABLE (not
ready, draining), RESOURCE_EXHAUSTED (the queue is full, other requests hold the body-memory budget
HTTP bodies share, or a message over ``--max-request-bytes``), INTERNAL (execution failed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from trtforge_runtime.errors import Code, RequestError, grpc_code
from trtforge_runtime.protocol import grpc_health as health
from trtforge_runtime.protocol.grpc_codec import Buffer, encode_infer_response, parse_infer_request
from trtforge_runtime.protocol.grpc_tensors import decode_infer_request
from trtforge_runtime.protocol.grpc_v2 import inference_pb2 as pb
from trtforge_runtime.serving.model import InferRequest, ModelSpec
from trtforge_runtime.serving.service import EXTENSIONS, Call, Service


class CallError(Exception):
    """A call that ends with status `code` and `message` instead of a response."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class GrpcInfer:
    """One ModelInfer call, serialised both ways (no (de)serialiser is registered for it), as the
    pipeline's ``Wire``. The message counts against the body-memory budget HTTP bodies share until it
    is answered; grpc.aio has already read it, so waiting would not save memory: with the budget
    taken it is refused at once (RESOURCE_EXHAUSTED)."""

    def __init__(self, request: Buffer, svc: Service) -> None:
        self.request, self.svc = request, svc
        self.msg = pb.ModelInferRequest()
        self.raw: Sequence[bytes | memoryview] = ()

    def model(self) -> tuple[str, str | None]:
        self.msg, self.raw = parse_infer_request(self.request)  # RequestError if it does not parse
        return self.msg.model_name, self.msg.model_version or None

    async def receive(self, call: Call) -> None:
        call.reserved += self.svc.bodies.hold(len(self.request))

    def decodes_inline(self, spec: ModelSpec) -> bool:
        return not spec.has_bytes_inputs  # BYTES elements are Python objects: decoded off the loop

    def decode(self, spec: ModelSpec) -> tuple[InferRequest, int]:
        req = decode_infer_request(self.msg, spec, self.raw)
        return req, spec.validate(req.inputs)

    def encode(self, spec: ModelSpec, req: InferRequest, results: dict[str, np.ndarray]) -> bytes:
        return encode_infer_response(spec, req, results)


def model_infer(rt: Service, request: Buffer) -> Awaitable[bytes]:
    """ModelInfer: the serialised request through the service's pipeline, the answer serialised."""
    return rt.infer(GrpcInfer(request, rt))


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
