"""Errors that end the runtime with a reason the operator can act on (see trtforge.contract.termination)."""

from __future__ import annotations

from trtforge.contract.termination import Reason


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

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
