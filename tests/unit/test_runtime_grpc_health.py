"""The gRPC health service: the pure status rule, and its messages read and written the way
grpcio-health-checking's own generated stubs (a client no one here wrote) read and write them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2
from trtforge_runtime.errors import Code
from trtforge_runtime.protocol import grpc_health as health
from trtforge_runtime.protocol.grpc_calls import READINESS_NAMES, SERVICE, CallError, health_check
from trtforge_runtime.protocol.grpc_health import ServingStatus, status_for


def test_readiness_follows_the_runtime_and_liveness_never_does() -> None:
    names = ("", "inference.GRPCInferenceService")
    for service in names:
        assert status_for(service, True, names) is ServingStatus.SERVING
        assert status_for(service, False, names) is ServingStatus.NOT_SERVING
    assert (
        status_for("liveness", False, names) is status_for("liveness", True, names) is ServingStatus.SERVING
    )
    assert status_for("inference.GRPCInferenceService/ModelInfer", True, names) is None
    assert status_for("Liveness", True, names) is None  # names are exact
    assert READINESS_NAMES == ("", SERVICE)  # a probe's default, and the v2 service


def test_the_statuses_are_the_protocols_by_name_and_number() -> None:
    official = health_pb2.HealthCheckResponse.ServingStatus
    assert {s.name: s.value for s in ServingStatus} == dict(official.items())


@pytest.mark.parametrize("service", ["", "liveness", "inference.GRPCInferenceService", "ünïcode"])
def test_messages_read_and_write_as_the_official_stubs_do(service: str) -> None:
    wire = health_pb2.HealthCheckRequest(service=service).SerializeToString()
    assert health.parse_request(wire) == health.parse_request(memoryview(wire)) == service
    for status in ServingStatus:
        official = health_pb2.HealthCheckResponse.FromString(health.encode_response(status))
        assert official.status == status.value
        assert (
            health.encode_response(status)
            == health_pb2.HealthCheckResponse(status=status.value).SerializeToString()
        )
    with pytest.raises(DecodeError):
        health.parse_request(b"\x0a\x05ab")  # a string field whose bytes stop short


def _runtime(ready: bool) -> SimpleNamespace:
    """What the health check reads of the runtime (a pure function's input)."""
    return SimpleNamespace(not_ready_reason=lambda: None if ready else "loading")


def test_check_answers_with_the_protocols_status_codes() -> None:

    def check(ready: bool, service: str) -> int:
        request = health_pb2.HealthCheckRequest(service=service).SerializeToString()
        answer = health_check(_runtime(ready), request)  # type: ignore[arg-type]
        return int(health_pb2.HealthCheckResponse.FromString(answer).status)

    assert (
        check(True, "")
        == check(True, SERVICE)
        == check(False, "liveness")
        == health_pb2.HealthCheckResponse.SERVING
    )
    assert check(False, "") == check(False, SERVICE) == health_pb2.HealthCheckResponse.NOT_SERVING
    with pytest.raises(CallError) as e:
        check(True, "nope")
    assert e.value.code is Code.NOT_FOUND and "'nope'" in e.value.message and "'liveness'" in e.value.message
    with pytest.raises(CallError) as e:
        health_check(_runtime(True), b"\x0a\x05ab")  # type: ignore[arg-type]
    assert e.value.code is Code.INVALID_ARGUMENT and "HealthCheckRequest" in e.value.message
