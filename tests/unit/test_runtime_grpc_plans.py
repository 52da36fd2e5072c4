"""InferPlans: a ModelInfer message seen before decodes to what the full decode gives, without it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from trtforge_runtime.errors import RequestError
from trtforge_runtime.grpc_calls import decode_infer_request, parse_infer_request
from trtforge_runtime.grpc_plans import PLAN_MAX_HEAD_BYTES, PLANS, InferPlans
from trtforge_runtime.grpc_v2 import inference_pb2 as pb
from trtforge_runtime.model import ModelSpec, model_spec
from trtforge_runtime.v2 import InferRequest

from tests.unit.test_runtime import _manifest

SPEC = model_spec(_manifest(), "mlp")  # x: FP32 [-1, 4] (max batch 16); outputs y FP32 [-1, 2], s BYTES


def _message(x: np.ndarray, rid: str = "", outputs: tuple[str, ...] = ("y",), inline: bool = False) -> bytes:
    m = pb.ModelInferRequest(model_name="mlp", id=rid)
    t = m.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    if inline:
        t.contents.fp32_contents.extend(x.reshape(-1).tolist())
    else:
        m.raw_input_contents.append(x.tobytes())
    for name in outputs:
        m.outputs.add(name=name)
    return m.SerializeToString()


def _full(data: bytes, spec: ModelSpec = SPEC) -> tuple[InferRequest, int, object]:
    msg, raw = parse_infer_request(data)
    req = decode_infer_request(msg, spec, raw)
    return req, spec.validate(req.inputs), raw


def _decode(plans: InferPlans, data: bytes, spec: ModelSpec = SPEC) -> tuple[InferRequest, int, bool]:
    """What the runtime does with a message: a kept plan, or the full decode (then kept)."""
    got = plans.lookup(data, spec)
    if got.found is not None:
        return got.found[1], got.found[2], True
    req, rows, raw = _full(data, spec)
    if got.key is not None:
        plans.keep(got.key, spec, req, rows, raw)  # type: ignore[arg-type]
    return req, rows, False


def _same(a: InferRequest, b: InferRequest) -> None:
    assert (a.id, a.outputs, list(a.inputs)) == (b.id, b.outputs, list(b.inputs))
    for name in a.inputs:
        assert a.inputs[name].dtype == b.inputs[name].dtype
        np.testing.assert_array_equal(a.inputs[name], b.inputs[name])


def test_a_message_with_the_same_head_decodes_from_the_plan_to_what_the_full_decode_gives() -> None:
    rng = np.random.default_rng(1)
    plans = InferPlans()
    first = rng.standard_normal((3, 4)).astype(np.float32)
    _, rows, planned = _decode(plans, _message(first, rid="r1", outputs=("y", "s")))
    assert (rows, planned, len(plans)) == (3, False, 1)
    for _ in range(3):
        x = rng.standard_normal((3, 4)).astype(np.float32)  # new tensor bytes, the same head
        data = bytearray(_message(x, rid="r1", outputs=("y", "s")))
        req, rows, planned = _decode(plans, data)
        assert planned and rows == 3
        _same(req, _full(bytes(data))[0])
        data[-4:] = b"\x00\x00\x80\x7f"  # the input is a view of the message, as in the full decode
        assert np.isinf(req.inputs["x"][-1, -1])


def test_another_shape_id_or_output_is_another_plan() -> None:
    plans = InferPlans()
    x = np.ones((2, 4), np.float32)
    _decode(plans, _message(x))
    others = (_message(np.ones((5, 4), np.float32)), _message(x, rid="other"), _message(x, outputs=("s",)))
    for data in others:
        req, _, planned = _decode(plans, data)
        assert not planned
        _same(req, _full(data)[0])
    assert len(plans) == 4


def test_a_plan_serves_only_the_model_it_was_made_for() -> None:
    """A reload makes a new spec: plans of the old one are not used for it."""
    plans = InferPlans()
    data = _message(np.ones((2, 4), np.float32))
    _decode(plans, data)
    reloaded = dataclasses.replace(SPEC)
    assert plans.lookup(data, reloaded).found is None
    assert plans.lookup(data, None).found is None
    assert plans.lookup(data, SPEC).found is not None


def test_a_refused_message_is_refused_every_time() -> None:
    plans = InferPlans()
    bad = _message(np.ones((2, 5), np.float32))  # the model takes [-1, 4]
    for _ in range(2):
        with pytest.raises(RequestError, match="x"):
            _decode(plans, bad)
    too_many = _message(np.ones((17, 4), np.float32))  # over the max batch of 16
    for _ in range(2):
        with pytest.raises(RequestError):
            _decode(plans, too_many)
    assert len(plans) == 0


def test_inline_contents_and_long_heads_are_never_kept() -> None:
    plans = InferPlans()
    x = np.ones((2, 4), np.float32)
    inline = _message(x, inline=True)
    assert plans.lookup(inline, SPEC).key is None  # its values are in the head
    _decode(plans, inline)
    long = _message(x, rid="r" * PLAN_MAX_HEAD_BYTES)
    assert plans.lookup(long, SPEC).key is None
    assert len(plans) == 0


def test_at_most_plans_are_kept_the_oldest_going_first() -> None:
    plans = InferPlans()
    x = np.ones((1, 4), np.float32)
    for i in range(PLANS + 1):
        _decode(plans, _message(x, rid=str(i)))
    assert len(plans) == PLANS
    assert plans.lookup(_message(x, rid="0"), SPEC).found is None
    assert plans.lookup(_message(x, rid=str(PLANS)), SPEC).found is not None
