"""gRPC calls that cannot finish end, and no few connections hold the server's call slots.

grpc.aio counts a call against ``maximum_concurrent_rpcs`` from its HEADERS until its status is sent,
and for a unary method it waits for the request message before the handler runs, with no deadline
of its own: a call whose message never arrives whole (a length prefix that claims more than the
stream carries, or a sender that stalls) would hold its slot until the client leaves. So ModelInfer
is served as a request-streaming method (:func:`one_message`): the handler runs at once, reads the
one message under ``--grpc-message-timeout`` and ends the call itself (DEADLINE_EXCEEDED past it,
INVALID_ARGUMENT for a stream that ends without a whole message), which frees the slot. And each
connection may open only its share of the slots (:func:`streams_per_connection`, the HTTP/2
``SETTINGS_MAX_CONCURRENT_STREAMS`` the server announces). docs/design.md §"Runtime request limits".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

# A connection may hold 1/CONNECTION_SHARE of the call slots, and never more than RFC 9113's
# recommended floor of 100 streams: it takes CONNECTION_SHARE connections to hold them all.
CONNECTION_SHARE = 16
MAX_STREAMS = 100


# Every connection is sent GOAWAY after CONNECTION_AGE_S, and closed, with whatever calls it still has,
# CONNECTION_GRACE_S later: the backstop for calls that make no progress after their message arrived
# (an answer a zero-window client never reads holds its slot until then). Clients reconnect at once.
CONNECTION_AGE_S = 600
CONNECTION_GRACE_S = 60


def connection_options() -> list[tuple[str, int]]:
    """grpc.aio's options for a connection's age (pure)."""
    return [
        ("grpc.max_connection_age_ms", CONNECTION_AGE_S * 1000),
        ("grpc.max_connection_age_grace_ms", CONNECTION_GRACE_S * 1000),
    ]


def streams_per_connection(call_slots: int) -> int:
    """The streams one HTTP/2 connection may have open at once, for a server of `call_slots` (pure)."""
    return max(1, min(MAX_STREAMS, call_slots // CONNECTION_SHARE))


Unary = Callable[[bytes, "aio.ServicerContext[Any, Any]"], Awaitable[bytes]]
RequestStreaming = Callable[[Any, "aio.ServicerContext[Any, Any]"], Awaitable[bytes]]


def one_message(handler: Unary, timeout_s: float) -> RequestStreaming:
    """`handler` (a serialised request in, a serialised response out) as a request-streaming
    behaviour that reads the call's one message within `timeout_s` first."""

    async def behaviour(requests: Any, context: aio.ServicerContext[Any, Any]) -> bytes:
        try:
            async with asyncio.timeout(timeout_s):
                message = await context.read()
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"the request message did not arrive whole within {timeout_s:g} s (--grpc-message-timeout)",
            )
        if message is aio.EOF:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "the call ended without a whole request message: a unary call sends exactly one",
            )
        return await handler(message, context)

    return behaviour


def handler(behaviour: Unary, timeout_s: float) -> grpc.RpcMethodHandler:
    """A method handler that runs the unary `behaviour` through :func:`one_message`, serialised both
    ways (no deserialiser or serialiser)."""
    return grpc.stream_unary_rpc_method_handler(one_message(behaviour, timeout_s))
