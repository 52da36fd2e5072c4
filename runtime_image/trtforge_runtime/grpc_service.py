"""The v2 protocol over gRPC on grpcio's grpc.aio server.

It runs the calls of ``grpc_calls`` in the runtime's event loop, behind the same model checks,
batcher, limits, metrics and readiness as HTTP. The stubs are generated from
grpc_v2/inference.proto and shipped (see grpc_v2/generate.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from grpc import aio

from trtforge_runtime import grpc_call_guard
from trtforge_runtime import grpc_calls as calls
from trtforge_runtime import grpc_health as health
from trtforge_runtime.errors import Code, RequestError, grpc_code
from trtforge_runtime.grpc_calls import CallError
from trtforge_runtime.grpc_v2 import inference_pb2_grpc as pb_grpc
from trtforge_runtime.service import Service

log = logging.getLogger(__name__)


def status_for(code: Code) -> grpc.StatusCode:
    """grpcio's StatusCode for `code`."""
    for s in grpc.StatusCode:
        if s.value[0] == int(code):
            return s
    return grpc.StatusCode.UNKNOWN


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The servicer: grpcio's handlers over ``grpc_calls``."""

    def __init__(self, service: Service) -> None:
        self._rt = service

    async def _call(self, fn: Any, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        try:
            return fn(self._rt, request)
        except CallError as e:
            await context.abort(status_for(e.code), e.message)

    async def ServerLive(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return await self._call(calls.server_live, request, context)

    async def ServerReady(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return await self._call(calls.server_ready, request, context)

    async def ModelReady(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return await self._call(calls.model_ready, request, context)

    async def ServerMetadata(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return await self._call(calls.server_metadata, request, context)

    async def ModelMetadata(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return await self._call(calls.model_metadata, request, context)

    async def ModelConfig(self, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return await self._call(calls.model_config, request, context)

    async def ModelInfer(self, request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        """`request` arrives serialised and the answer leaves serialised (no deserialiser or
        serialiser is registered, see _handlers): raw contents are read in place and written once.
        The message counts against the body-memory budget HTTP bodies share until it is answered;
        grpc.aio has already read it, so waiting would not save memory: with the budget taken it is
        refused at once (RESOURCE_EXHAUSTED) and freed."""
        svc = self._rt
        try:
            with svc.call() as call:
                call.reserved = svc.bodies.hold(len(request))
                msg, raw = calls.parse_infer_request(request)
                spec = svc.admit(msg.model_name, msg.model_version or None)
                if spec.has_bytes_inputs:  # BYTES elements are Python objects: decoded off the loop
                    loop = asyncio.get_running_loop()
                    req = await loop.run_in_executor(
                        svc.decode_pool, calls.decode_infer_request, msg, spec, raw
                    )
                else:
                    req = calls.decode_infer_request(msg, spec, raw)
                rows = spec.validate(req.inputs)
                results = await svc.infer(req.inputs, rows)
                return calls.encode_infer_response(spec, req, results)
        except RequestError as e:
            await context.abort(status_for(grpc_code(e)), e.message)
        except Exception as e:
            log.exception("inference failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"inference failed: {e}")
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


def _handlers(servicer: InferenceService, message_timeout_s: float) -> tuple[str, dict[str, Any]]:
    """The generated stubs' handlers for `servicer`, except that ModelInfer takes its request and
    returns its response serialised (parse_infer_request, encode_infer_response), and reads its
    message within `message_timeout_s` (grpc_call_guard)."""
    reg = _Registrations()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, reg)
    infer = reg.handlers["ModelInfer"]  # a grpc.RpcMethodHandler: its documented attributes only
    reg.handlers["ModelInfer"] = grpc_call_guard.handler(infer.unary_unary, message_timeout_s)
    return reg.service, reg.handlers


def _health(servicer: InferenceService) -> grpc.GenericRpcHandler:
    """``grpc.health.v1.Health/Check``, serialised both ways as grpc_calls runs it, its refusals
    aborted as the servicer's are (grpcio answers UNIMPLEMENTED for Watch, which is not served)."""

    async def check(request: bytes, context: aio.ServicerContext[Any, Any]) -> bytes:
        return bytes(await servicer._call(calls.health_check, request, context))

    return grpc.method_handlers_generic_handler(
        health.SERVICE, {"Check": grpc.unary_unary_rpc_method_handler(check)}
    )


def grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_grpc(service: Service, host: str, port: int) -> tuple[aio.Server, int]:
    """Serve the runtime over gRPC on host:port (0: any free port); the server and its port.

    ``so_reuseport`` is off (except for the workers of ``--workers N``, which share the port on
    purpose), so a port in use is an error rather than silently shared; messages are
    limited to ``--max-request-bytes`` (gRPC answers RESOURCE_EXHAUSTED past it, after its own
    decompression); connections idle for ``--idle-timeout`` are closed; a connection carries at most
    its share of the call slots at once (grpc_call_guard.streams_per_connection).
    """
    s = service.s
    server = aio.server(
        options=[
            ("grpc.so_reuseport", 1 if s.reuse_port else 0),
            ("grpc.max_receive_message_length", s.max_request_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_connection_idle_ms", int(s.idle_timeout_s * 1000)),
            # At most its share of the call slots open at once on one connection. Without it one
            # connection can open calls until `maximum_concurrent_rpcs` is spent (a client that never
            # opens its receive window holds them all) and a rapid reset cancels legitimate calls;
            # docs/security.md ("Hostile clients") has the measurements.
            ("grpc.max_concurrent_streams", grpc_call_guard.streams_per_connection(s.max_connections)),
            *grpc_call_guard.connection_options(),
        ],
        maximum_concurrent_rpcs=s.max_connections,
    )
    servicer = InferenceService(service)
    name, handlers = _handlers(servicer, s.grpc_message_timeout_s)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers), _health(servicer)))
    server.add_registered_method_handlers(name, handlers)
    address = grpc_address(host, port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:
        raise OSError(f"cannot listen for gRPC on {address}: {e}") from e
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address} (in use?)")
    await server.start()
    return server, bound
