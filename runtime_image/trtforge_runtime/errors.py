"""The runtime's errors, and the one place where a refused request's error becomes an HTTP status, a
gRPC status code and a metrics outcome.

:class:`Refusal` ends the runtime with a reason the operator can act on (see
trtforge.contract.termination); :class:`RequestError` refuses one request. A request error carries
the HTTP status of its kind (400 bad request, 404 unknown model, 408 body too slow, 413 too large,
415 content coding, 503 not ready or busy); :func:`grpc_code` and :func:`outcome_for` map it for gRPC
and for the request metrics, so both front ends answer the same refusal the same way.
"""

from __future__ import annotations

import enum

from trtforge.contract.termination import Reason
from trtforge_runtime.serving.metrics import Outcome


class Refusal(Exception):
    """The runtime refuses to serve: the message says what was wrong and what was expected."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason
        self.message = message


class DeviceFault(RuntimeError):
    """The backend saw a device-level error (e.g. a sticky CUDA error): the GPU cannot be trusted."""


class RequestError(Exception):
    """A request the server answers with an error status (400, 404, 413, 503...)."""

    busy = False  # the server is out of a shared resource (queue, body memory) right now

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class Code(enum.IntEnum):
    """gRPC status codes (the ones this server answers with), by gRPC's names and numbers."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14


# Each HTTP status a request error has: its gRPC code and its metrics outcome.
_BY_STATUS: dict[int, tuple[Code, Outcome]] = {
    400: (Code.INVALID_ARGUMENT, Outcome.BAD_REQUEST),
    404: (Code.NOT_FOUND, Outcome.NOT_FOUND),
    408: (Code.DEADLINE_EXCEEDED, Outcome.TIMEOUT),
    413: (Code.RESOURCE_EXHAUSTED, Outcome.TOO_LARGE),
    415: (Code.INVALID_ARGUMENT, Outcome.UNSUPPORTED_ENCODING),
    503: (Code.UNAVAILABLE, Outcome.UNAVAILABLE),
}


def grpc_code(e: RequestError) -> Code:
    """The gRPC status of a refusal: its HTTP status's, except that a busy server (a full queue, the
    body-memory budget held) is RESOURCE_EXHAUSTED, as gRPC clients expect to retry it."""
    if e.busy:
        return Code.RESOURCE_EXHAUSTED
    return _BY_STATUS.get(e.status, (Code.INTERNAL, Outcome.ERROR))[0]


def outcome_for(status: int) -> Outcome:
    """The metrics outcome of a request refused with HTTP `status`, over either protocol (over gRPC:
    the status its refusal has on the REST endpoint); ERROR for any status without its own."""
    return _BY_STATUS.get(status, (Code.INTERNAL, Outcome.ERROR))[1]
