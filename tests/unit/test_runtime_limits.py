"""Runtime request limits in-process: header checks before decoding, content codings, body reading,
the shared body-memory budget and the answers given past the connection cap."""

from __future__ import annotations

import asyncio
import json
import struct

import numpy as np
import pytest
from trtforge_runtime.errors import RequestError
from trtforge_runtime.protocol.connections import ConnectionLimiter, overflow_answer
from trtforge_runtime.protocol.v2 import JSON_SLACK, decode_request, json_limit
from trtforge_runtime.serving.body import (
    BODY_GRACE_S,
    BODY_MIN_RATE,
    BodyMemoryFull,
    Coding,
    MemoryBudget,
    body_deadline,
    content_coding,
    read_body,
)
from trtforge_runtime.serving.metrics import Metrics
from trtforge_runtime.serving.model import model_spec

from tests.unit.test_runtime import _manifest
from trtforge.contract.manifest import TensorSpec

SPEC = model_spec(_manifest(), "mlp")  # x: FP32 [-1, 4], profile max batch 16


def _binary(name: str, datatype: str, shape: list[int], blob: bytes) -> tuple[bytes, int]:
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": datatype,
                    "shape": shape,
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    return head + blob, len(head)


def test_header_declarations_are_checked_against_the_model_before_any_data() -> None:
    # Binary data far smaller than declared: the declaration itself is refused, naming the field.
    for name, datatype, shape, msg in [
        ("x", "FP32", [10**9, 4], "batch size 1000000000 exceeds the model's max batch size 16"),
        ("x", "FP32", [2, 10**6], r"shape \[2, 1000000\], expected \[-1, 4\]"),
        ("x", "BYTES", [2, 4], "datatype BYTES, expected FP32"),
        ("z", "FP32", [1, 4], "unknown input 'z'"),
        ("x", "FP32", [0, 4], "batch size .* at least 1"),
    ]:
        body, hl = _binary(name, datatype, shape, b"\0" * 16)
        with pytest.raises(RequestError, match=msg) as e:
            decode_request(body, hl, SPEC)
        assert e.value.status == 400


def test_bytes_elements_are_decoded_up_to_the_declared_count_only() -> None:
    text = model_spec(_manifest(inputs=[TensorSpec(name="t", dtype="str", shape=[-1])]), "text")
    ok, hl = _binary("t", "BYTES", [2], struct.pack("<I", 1) + b"a" + struct.pack("<I", 0))
    assert list(decode_request(ok, hl, text).inputs["t"]) == [b"a", b""]
    # Millions of empty elements behind a header that declares two: refused after two.
    body, hl = _binary("t", "BYTES", [2], b"\0" * 4_000_000)
    with pytest.raises(RequestError, match="3999992 bytes of binary data left after its 2 BYTES elements"):
        decode_request(body, hl, text)
    body, hl = _binary("t", "BYTES", [3], struct.pack("<I", 1) + b"a")
    with pytest.raises(RequestError, match="1 BYTES elements in the binary data, expected 3"):
        decode_request(body, hl, text)
    body, hl = _binary("t", "BYTES", [1], struct.pack("<I", 99) + b"a")
    with pytest.raises(RequestError, match="overruns"):
        decode_request(body, hl, text)


def test_json_is_bounded_by_the_models_largest_request() -> None:
    limit = json_limit(SPEC, 8 << 20)
    assert limit == JSON_SLACK + 64 * 16 * 4  # 16 rows of 4 values
    big = json.dumps(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [16, 4], "data": [0.0] * 64}],
            "pad": "x" * limit,
        }
    ).encode()
    with pytest.raises(RequestError, match=f"at most {limit} bytes of JSON") as e:
        decode_request(big, None, SPEC)
    assert e.value.status == 413
    many = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0] * 5000}]})
    with pytest.raises(RequestError, match="holds over 5003 values; the model's inputs take at most 64"):
        decode_request(many.encode(), None, SPEC)
    with pytest.raises(RequestError, match="nested too deeply"):
        decode_request(b"[" * 60_000, None, SPEC)
    # The explicit cap applies too, and a model with a BYTES input has no derived bound.
    assert json_limit(SPEC, 1000) == 1000
    text = model_spec(_manifest(inputs=[TensorSpec(name="t", dtype="str", shape=[-1])]), "text")
    assert json_limit(text, 8 << 20) == 8 << 20
    ok = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": list(range(8))}]})
    np.testing.assert_array_equal(decode_request(ok.encode(), None, SPEC).inputs["x"].ravel(), np.arange(8))


def test_content_codings() -> None:
    assert content_coding(None) is Coding.IDENTITY and content_coding("identity") is Coding.IDENTITY
    assert content_coding("GZIP") is Coding.GZIP and content_coding("deflate") is Coding.DEFLATE
    for bad in ("br", "zstd", "gzip, gzip"):
        with pytest.raises(RequestError, match="not supported; send one of gzip, deflate, identity") as e:
            content_coding(bad)
        assert e.value.status == 415


class _Chunks:
    def __init__(self, *chunks: bytes) -> None:
        self._chunks = list(chunks)

    async def readany(self) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""


@pytest.mark.asyncio
async def test_read_body_stops_at_the_limit_and_on_short_bodies() -> None:
    assert await read_body(_Chunks(b"ab", b"cd"), 4, 10) == b"abcd"
    assert await read_body(_Chunks(b"ab", b"cd"), None, 10) == b"abcd"
    with pytest.raises(RequestError, match="exceeds the limit of 3 bytes") as e:
        await read_body(_Chunks(b"ab", b"cd"), None, 3)
    assert e.value.status == 413
    with pytest.raises(RequestError, match="ended after 2 of its 4 bytes"):
        await read_body(_Chunks(b"ab"), 4, 10)
    with pytest.raises(RequestError, match="20 bytes exceeds"):
        await read_body(_Chunks(), 20, 10)


@pytest.mark.asyncio
async def test_read_body_takes_each_piece_as_it_arrives() -> None:
    seen: list[int] = []

    async def arrived(n: int) -> None:
        seen.append(n)

    assert await read_body(_Chunks(b"ab", b"cde"), 5, 10, arrived) == b"abcde"
    assert seen == [2, 3]


@pytest.mark.asyncio
async def test_memory_budget_counts_what_arrived_waits_in_order_and_never_deadlocks() -> None:
    budget = MemoryBudget(100)
    a, b, c = budget.reader(), budget.reader(), budget.reader()
    await a.take(60)
    assert budget.used == 60
    with pytest.raises(BodyMemoryFull):
        budget.hold(50)  # a whole gRPC message that does not fit: refused at once
    order: list[str] = []

    async def take(r: object, name: str, n: int) -> None:
        await r.take(n)  # type: ignore[attr-defined]
        order.append(name)

    big = asyncio.create_task(take(b, "big", 70))
    small = asyncio.create_task(take(c, "small", 10))  # fits, but waits behind the older request
    await asyncio.sleep(0)
    assert budget.waiting == 2 and order == []
    assert budget.used == 60 and a.keep() == 60  # a's body arrived: it holds until its answer
    budget.release(60)
    await big
    await small
    assert order == ["big", "small"] and budget.used == 80
    b.close()
    c.close()
    assert budget.used == 0
    # Two readers each holding half, each needing more: the last to wait is refused, the other goes on.
    d, e = budget.reader(), budget.reader()
    await d.take(50)
    await e.take(50)
    first = asyncio.create_task(d.take(10))
    await asyncio.sleep(0)
    assert budget.waiting == 1  # e still reads: no deadlock yet
    with pytest.raises(BodyMemoryFull):
        await e.take(10)  # now both would wait on each other: e is refused...
    e.close()  # ...and gives its bytes back
    await first
    assert d.held == 60 and budget.used == 60
    d.close()
    assert budget.used == 0


def test_the_body_deadline_fits_the_claimed_size() -> None:
    assert body_deadline(None, 60) == 60  # chunked: the whole --body-timeout
    assert body_deadline(0, 60) == BODY_GRACE_S
    assert body_deadline(10 * BODY_MIN_RATE, 60) == BODY_GRACE_S + 10
    assert body_deadline(64 << 20, 60) == 60  # never past --body-timeout
    assert body_deadline(1000, 1) == 1


def _live(path: str) -> tuple[int, dict[str, object]] | None:
    return (200, {"live": True}) if path == "/v2/health/live" else None


def test_connections_past_the_cap_get_health_answers_or_503() -> None:
    assert overflow_answer("GET", "/v2/health/live", _live, 8) == (200, {"live": True})
    status, body = overflow_answer("POST", "/v2/models/m/infer", _live, 8)
    assert status == 503 and "8 open connections, its limit" in str(body["error"])
    assert overflow_answer("POST", "/v2/health/live", _live, 8)[0] == 503


@pytest.mark.asyncio
async def test_aiohttp_answers_past_the_cap_and_closes() -> None:
    """One connection fills a cap of one; the next ones get aiohttp's answers on real sockets: the
    health probe's, a 503 with Retry-After, and a silent one is closed after the answer timeout."""
    loop = asyncio.get_running_loop()
    metrics = Metrics("m", None)
    limiter = ConnectionLimiter(asyncio.Protocol, 1, _live, lambda: metrics, answer_timeout_s=0.2)
    srv = await loop.create_server(limiter, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]

    async def ask(request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), timeout=10)  # to EOF: the server closes
        writer.close()
        return answer

    try:
        held = await asyncio.open_connection("127.0.0.1", port)
        while limiter.open < 1:
            await asyncio.sleep(0.01)
        live = await ask(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert live.startswith(b"HTTP/1.1 200 OK\r\n") and live.endswith(b'{"live": true}')
        busy = await ask(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        assert busy.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1\r\n" in busy
        assert b"Connection: close\r\n" in busy and b"1 open connections, its limit" in busy
        assert await ask(b"") == b""  # nothing sent: closed after the answer timeout
        held[1].close()
    finally:
        srv.close()
        await srv.wait_closed()
