"""The standard gRPC health service, ``grpc.health.v1.Health/Check``: what Kubernetes' ``grpc`` probes
(and most load balancers' gRPC checks) call.

The service names it answers for, by :func:`status_for`:

- the caller's readiness names, ``""`` (a probe without ``service``) and the v2 service's
  (``grpc_calls`` passes them): SERVING once the runtime is ready (the engine fetched, verified,
  loaded and canary-checked, not draining), else NOT_SERVING: what a readiness probe wants;
- ``liveness``: SERVING whenever the server answers at all, so a liveness probe never kills a pod
  that is still loading its engine;
- any other: NOT_FOUND, as the protocol says.

``Watch`` (a server stream) is not served: UNIMPLEMENTED, which the protocol allows. The two messages
are built here from their field numbers into a descriptor pool of their own (the runtime ships no
health stubs, and another library's ``grpc.health.v1`` stubs can live in the same process);
docs/design.md, "Runtime protocols".
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Collection
from typing import Any

SERVICE = "grpc.health.v1.Health"
LIVENESS = "liveness"


class ServingStatus(enum.IntEnum):
    """``HealthCheckResponse.ServingStatus``."""

    UNKNOWN = 0
    SERVING = 1
    NOT_SERVING = 2
    SERVICE_UNKNOWN = 3  # Watch's answer for an unknown service; Check answers NOT_FOUND instead


def status_for(service: str, ready: bool, readiness: Collection[str]) -> ServingStatus | None:
    """The status of `service` on a runtime that is `ready` or not, `readiness` being the names whose
    status is that readiness; None for a service this server does not know (the caller answers
    NOT_FOUND)."""
    if service == LIVENESS:
        return ServingStatus.SERVING
    if service in readiness:
        return ServingStatus.SERVING if ready else ServingStatus.NOT_SERVING
    return None


@functools.cache
def messages() -> tuple[Any, Any]:
    """The HealthCheckRequest and HealthCheckResponse classes (grpc/health/v1/health.proto's fields),
    built at the first health check: protobuf's descriptor module costs the server's start ~10 ms."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(
        name="trtforge_runtime/grpc_health_v1.proto", package="grpc.health.v1", syntax="proto3"
    )
    request = f.message_type.add(name="HealthCheckRequest")
    request.field.add(name="service", number=1, type=fdp.TYPE_STRING, label=fdp.LABEL_OPTIONAL)
    response = f.message_type.add(name="HealthCheckResponse")
    statuses = response.enum_type.add(name="ServingStatus")
    for status in ServingStatus:
        statuses.value.add(name=status.name, number=status.value)
    response.field.add(
        name="status",
        number=1,
        type=fdp.TYPE_ENUM,
        type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
        label=fdp.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return (
        message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")),
        message_factory.GetMessageClass(pool.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")),
    )


def parse_request(data: bytes | bytearray | memoryview) -> str:
    """The service a serialised HealthCheckRequest asks about; raises protobuf's DecodeError."""
    request, _ = messages()
    return str(request.FromString(bytes(data)).service)


def encode_response(status: ServingStatus) -> bytes:
    """A serialised HealthCheckResponse with `status`."""
    _, response = messages()
    return bytes(response(status=int(status)).SerializeToString())
