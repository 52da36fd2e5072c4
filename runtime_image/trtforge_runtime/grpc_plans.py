"""ModelInfer requests decoded and checked once per distinct message head: gRPC's request plans.

A client's ModelInfer messages repeat everything but their tensors' bytes: the model, the inputs'
names, datatypes and shapes, the outputs asked for, the id. :class:`InferPlans` keeps what the full
decode of such a message found (``grpc_calls.parse_infer_request``, ``decode_infer_request`` and
``spec.validate``) under the message's bytes less its raw input contents (the *head*, a few hundred
bytes) and those contents' lengths. A message whose head and lengths were seen before, for the model
still served, is not parsed or checked again: its tensors are views of its own raw contents, as the
full decode makes them. The HTTP path's ``v2.RequestPlans`` does the same for JSON headers
(docs/design.md, "The runtime's request path").

Only requests whose every input is raw contents of a fixed-size datatype, with a head of at most
``PLAN_MAX_HEAD_BYTES``, are kept, at most ``PLANS`` of them (the oldest go first). A request the full
decode refuses is never kept, so it is refused each time.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from trtforge_runtime.grpc_calls import Buffer, split_raw_contents
from trtforge_runtime.model import ModelSpec
from trtforge_runtime.v2 import InferRequest

PLAN_MAX_HEAD_BYTES = 2048
PLANS = 256

PlanKey = tuple[bytes, tuple[int, ...]]  # the head's bytes, each raw content's length


class _Plan(NamedTuple):
    spec: ModelSpec
    id: str | None
    inputs: tuple[tuple[str, np.dtype, int, tuple[int, ...]], ...]  # name, dtype, count, shape
    outputs: tuple[tuple[str, bool], ...]
    rows: int


class Lookup(NamedTuple):
    """What :meth:`InferPlans.lookup` found: the request when a plan matched, and the key to
    :meth:`InferPlans.keep` the full decode's result under (None: the message cannot be kept)."""

    found: tuple[ModelSpec, InferRequest, int] | None
    key: PlanKey | None


_NOT_KEPT = Lookup(None, None)


class InferPlans:
    """The runtime's kept ModelInfer plans (see the module docstring); the event loop and the
    decode pool may share it."""

    def __init__(self) -> None:
        self._plans: dict[PlanKey, _Plan] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._plans)

    def lookup(self, data: Buffer, served: ModelSpec | None) -> Lookup:
        """`data`'s request, batch rows and model when a kept plan for the model `served` matches
        it; else the key to keep it under (or none)."""
        split = split_raw_contents(data)
        if split is None:
            return _NOT_KEPT
        head, raw = split
        if not raw or len(head) > PLAN_MAX_HEAD_BYTES:
            return _NOT_KEPT
        key = (head, tuple(len(r) for r in raw))
        plan = self._plans.get(key)
        if plan is None or plan.spec is not served:
            return Lookup(None, key)
        inputs = {
            name: np.frombuffer(raw[i], dtype, count).reshape(shape)
            for i, (name, dtype, count, shape) in enumerate(plan.inputs)
        }
        return Lookup((plan.spec, InferRequest(plan.id, inputs, list(plan.outputs)), plan.rows), key)

    def keep(
        self, key: PlanKey, spec: ModelSpec, req: InferRequest, rows: int, raw: Sequence[object]
    ) -> None:
        """Keep what the full decode found for the message `key` came from (`raw`: its raw input
        contents), if every input came from raw contents of a fixed-size datatype."""
        if len(raw) != len(req.inputs) or any(a.dtype.kind == "O" for a in req.inputs.values()):
            return
        entries = tuple((n, a.dtype, a.size, a.shape) for n, a in req.inputs.items())
        with self._lock:
            while len(self._plans) >= PLANS:
                del self._plans[next(iter(self._plans))]
            self._plans[key] = _Plan(spec, req.id, entries, tuple(req.outputs), rows)
