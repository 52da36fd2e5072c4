"""The infer fast path's decision on a request head (trtforge_runtime.fastpath.infer_head, pure).

Eligible: POST over HTTP/1.1 to exactly the served model's infer path, one integer Content-Length
within the limit, no transfer or content coding but identity, no Expect/Upgrade. Everything else
goes to the aiohttp path (a reason string), which answers as it always has.
"""

from __future__ import annotations

import pytest
from trtforge_runtime.fastpath import (
    HEAD_END,
    InferHead,
    decide,
    enabled,
    infer_head,
    infer_path,
    response_head,
    why_off,
)

PATH = infer_path("mlp")
LIMIT = 10_000


def head(*headers: str, start: str = "POST /v2/models/mlp/infer HTTP/1.1") -> bytes:
    return ("\r\n".join([start, "Host: x", *headers]) + "\r\n\r\n").encode()


def test_infer_path_is_the_models_infer_target() -> None:
    assert PATH == b"/v2/models/mlp/infer"


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (["Content-Length: 300"], InferHead(300, None, True)),
        (["content-length: 300", "Inference-Header-Content-Length: 44"], InferHead(300, 44, True)),
        (["Content-Length: 300", "Content-Encoding: identity"], InferHead(300, None, True)),
        (["Content-Length: 300", "Connection: close"], InferHead(300, None, False)),
        (["Content-Length: 300", "Connection: keep-alive"], InferHead(300, None, True)),
        ([f"Content-Length: {LIMIT}"], InferHead(LIMIT, None, True)),
    ],
)
def test_eligible_heads(headers: list[str], expected: InferHead) -> None:
    assert infer_head(head(*headers), PATH, LIMIT) == expected


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (head("Content-Length: 3", start="GET /v2/models/mlp/infer HTTP/1.1"), "not a POST"),
        (head(start="GET /v2/health/ready HTTP/1.1"), "not a POST"),
        (head("Content-Length: 3", start="POST /v2/models/mlp/infer HTTP/1.0"), "HTTP/1.1"),
        (head("Content-Length: 3", start="POST /v2/models/other/infer HTTP/1.1"), "infer path"),
        (head("Content-Length: 3", start="POST /v2/models/mlp/infer?x=1 HTTP/1.1"), "infer path"),
        (head("Content-Length: 3", start="POST /v2/models/mlp/versions/1/infer HTTP/1.1"), "infer path"),
        (head("Content-Length: 3", start="POST /v2/models/m%6Cp/infer HTTP/1.1"), "infer path"),
        (head("Transfer-Encoding: chunked"), "transfer-encoding"),
        (head("Content-Length: 3", "Transfer-Encoding: chunked"), ""),
        (head("Content-Length: 3", "Content-Encoding: gzip"), "content coding"),
        (head("Content-Length: 3", "Content-Encoding: identity", "Content-Encoding: gzip"), "coding"),
        (head("Content-Length: 3", "Expect: 100-continue"), "expect"),
        (head("Content-Length: 3", "Connection: Upgrade", "Upgrade: h2c"), ""),
        (head(), "Content-Length"),
        (head("Content-Length: 3", "Content-Length: 3"), ""),
        (head("Content-Length: -3"), ""),
        (head("Content-Length: 3x"), ""),
        (head(f"Content-Length: {LIMIT + 1}"), "over the limit"),
        (head("Content-Length: 99999999999999999999999"), ""),
        (head("Content-Length: 3", "Inference-Header-Content-Length: x"), "Inference-Header"),
        (head("Content-Length: 3", "Inference-Header-Content-Length: -1"), "Inference-Header"),
        (
            head(
                "Content-Length: 3",
                "Inference-Header-Content-Length: 1",
                "Inference-Header-Content-Length: 2",
            ),
            "",
        ),
        (b"POST /v2/models/mlp/infer HTTP/1.1\nContent-Length: 3\n\r\n\r\n", ""),
        (b"POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: 3\r\n\r\n\r\n\r\n", "request head"),
        (b"POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: 3\r\n", "request head"),
        (b"POST /v2/models/mlp/infer HTTP/1.1\r\nBad Header: 1\r\nContent-Length: 3\r\n\r\n", "malformed"),
        (b"POST /v2/models/mlp/infer HTTP/1.1\r\n Folded: 1\r\nContent-Length: 3\r\n\r\n", ""),
        (b"POST /v2/models/mlp/infer HTTP/1.1\r\nContent-Length: 3\r\n\rX\r\n\r\n", ""),
    ],
)
def test_everything_else_goes_to_aiohttp(raw: bytes, why: str) -> None:
    got = infer_head(raw, PATH, LIMIT)
    assert isinstance(got, str), got
    assert why.lower() in got.lower()


def test_a_head_is_judged_only_by_its_first_blank_line() -> None:
    raw = head("Content-Length: 3")
    assert raw.endswith(HEAD_END)
    assert isinstance(infer_head(raw + b"abc", PATH, LIMIT), str)


def test_response_head() -> None:
    got = response_head(503, 12, {"Content-Type": "application/json", "Retry-After": "1"})
    assert got == (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        b"Content-Length: 12\r\n\r\n"
    )


def test_the_cached_decision_is_the_decision() -> None:
    raw = head("Content-Length: 300")
    assert decide(raw, PATH, LIMIT) == infer_head(raw, PATH, LIMIT) == decide(raw, PATH, LIMIT)
    assert decide(raw, PATH, 10) == "the body is over the limit"


def test_the_fast_path_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRTFORGE_HTTP_FAST_PATH", "0")
    assert not enabled() and why_off() == "TRTFORGE_HTTP_FAST_PATH=0"
    monkeypatch.delenv("TRTFORGE_HTTP_FAST_PATH")
    assert enabled() and why_off() is None
