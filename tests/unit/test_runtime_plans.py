"""Requests decoded once per distinct JSON header (trtforge_runtime.protocol.v2.RequestPlans) and answers
whose JSON header is built once (v2.encode_response): the same results as decoding and encoding anew."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from trtforge_runtime.errors import RequestError
from trtforge_runtime.protocol.v2 import (
    HEADER_CACHE_MAX_ID,
    PLAN_MAX_HEADER_BYTES,
    PLANS,
    InferRequest,
    RequestPlans,
    decode_request,
    encode_response,
)
from trtforge_runtime.serving.model import model_spec

from tests.unit.test_runtime import _manifest, bytes_request

SPEC = model_spec(_manifest(), "mlp")  # x: FP32 [-1, 4] (max batch 16) -> y: FP32 [-1, 2], s: BYTES


def _binary(x: np.ndarray, **extra: Any) -> tuple[bytes, int]:
    """A binary v2 request for input x: its body and its header's length."""
    size = {"binary_data_size": x.nbytes}
    header = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "parameters": size}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        **extra,
    }
    head = json.dumps(header).encode()
    return head + x.tobytes(), len(head)


def _same(got: tuple[InferRequest, int], want: InferRequest, rows: int) -> None:
    req, got_rows = got
    assert (req.id, req.outputs, got_rows) == (want.id, want.outputs, rows)
    assert req.inputs.keys() == want.inputs.keys()
    for name, arr in want.inputs.items():
        assert req.inputs[name].dtype == arr.dtype
        np.testing.assert_array_equal(req.inputs[name], arr)


def test_a_repeated_header_gives_what_a_full_decode_gives_with_its_own_bytes() -> None:
    plans = RequestPlans(SPEC)
    rng = np.random.default_rng(0)
    first, second = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    body1, hl = _binary(first, id="r1")
    body2, hl2 = _binary(second, id="r1")
    assert hl == hl2 and body1[:hl] == body2[:hl]  # the same header, other tensor bytes
    for body in (body1, body2, bytearray(body2), memoryview(body1)):
        want = decode_request(body, hl, SPEC)
        _same(plans.decode(body, hl), want, SPEC.validate(want.inputs))
    assert len(plans) == 1  # one header, decoded once
    req, _ = plans.decode(body2, hl)
    np.testing.assert_array_equal(req.inputs["x"], second)
    assert np.shares_memory(req.inputs["x"], np.frombuffer(body2, np.uint8))  # a view, not a copy


def test_the_body_length_is_part_of_the_key_so_unclaimed_bytes_are_still_refused() -> None:
    plans = RequestPlans(SPEC)
    body, hl = _binary(np.zeros((2, 4), np.float32))
    plans.decode(body, hl)
    with pytest.raises(RequestError, match="8 bytes of binary data are not claimed"):
        plans.decode(body + b"\0" * 8, hl)
    with pytest.raises(RequestError, match="does not fit"):
        plans.decode(body[:-4], hl)
    assert len(plans) == 1


def test_refused_requests_are_refused_every_time_and_never_kept() -> None:
    plans = RequestPlans(SPEC)
    body, hl = _binary(np.zeros((17, 4), np.float32))  # over the max batch of 16
    for _ in range(2):
        with pytest.raises(RequestError, match="exceeds the model's max batch size 16"):
            plans.decode(body, hl)
    assert len(plans) == 0


def test_only_all_binary_fixed_size_requests_with_short_headers_are_kept() -> None:
    plans = RequestPlans(SPEC)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inputs = [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": x.tolist()}]
    json_data = json.dumps({"inputs": inputs})
    plans.decode(json_data.encode(), len(json_data))  # a JSON input: its values are in the header
    plans.decode(json_data.encode(), None)  # no header length: the whole body is JSON
    long_id, long_hl = _binary(x, id="i" * PLAN_MAX_HEADER_BYTES)
    _same(plans.decode(long_id, long_hl), decode_request(long_id, long_hl, SPEC), 2)
    assert len(plans) == 0

    text, body, hl = bytes_request()
    text_plans = RequestPlans(text)
    for _ in range(2):
        assert list(text_plans.decode(body, hl)[0].inputs["t"]) == [b"a", b"bc"]
    assert len(text_plans) == 0


def test_the_plans_are_bounded_the_oldest_going_first() -> None:
    plans = RequestPlans(SPEC)
    x = np.ones((1, 4), np.float32)
    bodies = [_binary(x, id=f"client-{i}") for i in range(PLANS + 5)]
    for body, hl in bodies:
        plans.decode(body, hl)
    assert len(plans) == PLANS
    body, hl = bodies[0]  # forgotten: decoded again, and correctly
    _same(plans.decode(body, hl), decode_request(body, hl, SPEC), 1)
    assert len(plans) == PLANS


@pytest.mark.parametrize("rid", [None, "r7", "x" * (HEADER_CACHE_MAX_ID + 1)])
def test_an_all_binary_answer_is_byte_for_byte_the_general_one(rid: str | None) -> None:
    y = np.arange(6, dtype=np.float32).reshape(3, 2)
    s = np.array([[1.5, 2.5, 3.5]], np.float32).T.reshape(3)  # a non-contiguous view
    req = InferRequest(id=rid, inputs={}, outputs=[("y", True), ("s", True)])
    results = {"y": y, "s": s.astype(np.float32)[::-1]}
    header: dict[str, Any] = {"model_name": "mlp", "model_version": "1"}
    if rid is not None:
        header["id"] = rid
    header["outputs"] = [
        {"name": "y", "datatype": "FP32", "shape": [3, 2], "parameters": {"binary_data_size": 24}},
        {"name": "s", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 12}},
    ]
    want = json.dumps(header, separators=(",", ":")).encode()
    for _ in range(2):  # built, then from the cache
        body, hl = encode_response(SPEC, req, results)
        assert (body[:hl], hl) == (want, len(want))
        assert body[hl:] == y.tobytes() + np.ascontiguousarray(results["s"]).tobytes()
    other = InferRequest(id=rid, inputs={}, outputs=[("y", True)])  # another answer, its own header
    body, hl = encode_response(SPEC, other, {"y": y[:1]})
    assert json.loads(body[:hl])["outputs"] == [
        {"name": "y", "datatype": "FP32", "shape": [1, 2], "parameters": {"binary_data_size": 8}}
    ]
