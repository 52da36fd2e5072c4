"""The v2 protocol over gRPC on grpcio's grpc.aio server.

A thin adapter: grpcio's handlers run the calls of ``grpc_calls`` in the runtime's event loop, and
ModelInfer goes through the service's one request pipeline, as HTTP's inference does. The stubs are
generated from grpc_v2/inference.proto and shipped (see grpc_v2/generate.py).
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

import grpc
from grpc import aio

from trtforge_runtime.errors import Code, RequestError, grpc_code
from trtforge_runtime.protocol import grpc_call_guard
from trtforge_runtime.protocol import grpc_calls as calls
from trtforge_runtime.protocol import grpc_health as health
from trtforge_runtime.protocol.grpc_calls import CallError
from trtforge_runtime.protocol.grpc_v2 import inference_pb2_grpc as pb_grpc
from trtforge_runtime.serving.service import Service

log = logging.getLogger(__name__)


_STATUS = {s.value[0]: s for s in grpc.StatusCode}


def status_for(code: Code) -> grpc.StatusCode:
    """grpcio's StatusCode for `code`."""
    return _STATUS.get(int(code), grpc.StatusCode.UNKNOWN)


def _unary(fn: Any) -> Any:
    """A servicer method that answers with `fn(service, request)`, a CallError aborted with its code."""

    async def method(self: InferenceService, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        return await self._call(fn, request, context)

    return method


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):
    """The servicer: grpcio's handlers over ``grpc_calls``, and ModelInfer over the pipeline."""

    def __init__(self, service: Service) -> None:
        self._rt = service

    async def _call(self, fn: Any, request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        try:
            answer = fn(self._rt, request)
            return await answer if inspect.isawaitable(answer) else answer
        except CallError as e:
            await context.abort(status_for(e.code), e.message)
        except RequestError as e:
            await context.abort(status_for(grpc_code(e)), e.message)
        except Exception as e:
            log.exception("inference failed" if fn is calls.model_infer else "call failed")
            await context.abort(grpc.StatusCode.INTERNAL, f"inference failed: {e}")

    ServerLive = _unary(calls.server_live)
    ServerReady = _unary(calls.server_ready)
    ModelReady = _unary(calls.model_ready)
    ServerMetadata = _unary(calls.server_metadata)
    ModelMetadata = _unary(calls.model_metadata)
    ModelConfig = _unary(calls.model_config)
    ModelInfer = _unary(calls.model_infer)  # serialised both ways (see _handlers)


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
    returns its response serialised (grpc_calls.GrpcInfer), its message read within
    `message_timeout_s` (grpc_call_guard)."""
    reg = _Registrations()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, reg)
    infer = reg.handlers["ModelInfer"]  # a grpc.RpcMethodHandler: its documented attributes only
    reg.handlers["ModelInfer"] = grpc_call_guard.handler(infer.unary_unary, message_timeout_s)
    return reg.service, reg.handlers


def _health(servicer: InferenceService) -> grpc.GenericRpcHandler:
    """``grpc.health.v1.Health/Check``, serialised both ways as grpc_calls runs it, its refusals
    aborted as the servicer's are (grpcio answers UNIMPLEMENTED for Watch, which is not served)."""

    check = functools.partial(servicer._call, calls.health_check)
    return grpc.method_handlers_generic_handler(
        health.SERVICE, {"Check": grpc.unary_unary_rpc_method_handler(check)}
    )


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
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:
        raise OSError(f"cannot listen for gRPC on {address}: {e}") from e
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address} (in use?)")
    await server.start()
    return server, bound
