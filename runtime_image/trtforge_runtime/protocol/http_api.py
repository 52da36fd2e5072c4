"""The v2 protocol over HTTP/1.1 on aiohttp: a thin adapter onto the service's one request pipeline.

Endpoints (KServe Open Inference Protocol v2, plus /metrics): ``/v2/health/live``, ``/v2/health/ready``,
``/v2``, ``/v2/models/{name}[/versions/{v}]``, ``.../ready``, ``.../config``, ``.../infer``. Errors are
``{"error": "..."}`` with the status of the service's refusal (``errors``) or 500 (execution failed).
An inference request is an :class:`HttpInfer`, the pipeline's ``Wire`` (docs/design.md, "Runtime
request limits").
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST

from trtforge_runtime.errors import RequestError
from trtforge_runtime.protocol.v2 import HEADER_LENGTH, RequestPlans, encode_response
from trtforge_runtime.serving.body import Coding, content_coding
from trtforge_runtime.serving.model import InferRequest, ModelSpec
from trtforge_runtime.serving.service import Call, Service

log = logging.getLogger(__name__)
JSON = "application/json"
# Identity-coded bodies whose JSON part is at most this big are decoded on the event loop (binary
# tensors are views of the body: microseconds); larger or compressed ones in a worker thread.
INLINE_DECODE_BYTES = 64 << 10


def _json(obj: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=json.dumps(obj).encode(), content_type=JSON, headers=headers)


class HttpInfer:
    """One ``POST .../infer``, as the pipeline's ``Wire``."""

    def __init__(self, request: web.Request, svc: Service, plans: Callable[[ModelSpec], RequestPlans]):
        self.request, self.svc, self._plans = request, svc, plans
        self.coding = Coding.IDENTITY
        self.header_length: int | None = None
        self.raw: bytes | bytearray = b""

    def model(self) -> tuple[str, str | None]:
        return self.request.match_info["name"], self.request.match_info.get("version")

    async def receive(self, call: Call) -> None:
        headers = self.request.headers
        self.coding = content_coding(headers.get("Content-Encoding"))
        hl = headers.get(HEADER_LENGTH)
        try:
            self.header_length = int(hl) if hl is not None else None
        except ValueError as e:
            raise RequestError(400, f"{HEADER_LENGTH} {hl!r} is not an integer") from e
        try:
            self.raw = await self.svc.receive(
                self.request.content, self.request.content_length, self.coding, call
            )
        except RequestPayloadError as e:
            raise RequestError(400, f"request body is malformed: {e}") from e

    def decodes_inline(self, spec: ModelSpec) -> bool:
        json_part = len(self.raw) if self.header_length is None else self.header_length
        return (
            self.coding is Coding.IDENTITY and json_part <= INLINE_DECODE_BYTES and not spec.has_bytes_inputs
        )

    def decode(self, spec: ModelSpec) -> tuple[InferRequest, int]:
        body, self.raw = self.raw, b""  # inflated by the service; not kept while the request waits
        return self._plans(spec).decode(body, self.header_length)

    def encode(self, spec: ModelSpec, req: InferRequest, results: dict[str, np.ndarray]) -> web.Response:
        out, hl = encode_response(spec, req, results)
        if hl is None:
            return web.Response(body=out, content_type=JSON)
        return web.Response(
            body=out, headers={HEADER_LENGTH: str(hl), "Content-Type": "application/octet-stream"}
        )


class HttpApi:
    def __init__(self, service: Service, open_connections: Callable[[], int]) -> None:
        self.svc = service
        self._open_connections = open_connections
        self._plans: RequestPlans | None = None  # the served model's decoded request headers

    def plans(self, spec: ModelSpec) -> RequestPlans:
        if self._plans is None or self._plans.spec is not spec:
            self._plans = RequestPlans(spec, self.svc.s.max_json_bytes)
        return self._plans

    async def infer(self, request: web.Request) -> web.Response:
        try:
            return await self.svc.infer(HttpInfer(request, self.svc, self.plans))
        except RequestError as e:
            refused = _json({"error": e.message}, e.status, e.headers)
            if not request.content.is_eof():  # a body left unread: the connection cannot go on
                refused.force_close()
            return refused
        except Exception as e:
            log.exception("inference failed")
            return _json({"error": f"inference failed: {e}"}, 500)

    async def _answer(self, request: web.Request, kind: str) -> web.Response:
        """The answers other than inference, from the service."""
        name, version = request.match_info.get("name", ""), request.match_info.get("version")
        svc = self.svc
        try:
            if kind == "metadata":
                return _json(svc.model_spec_for(name, version).metadata())
            if kind == "config":
                return _json(svc.config_for(name, version))
            why = svc.model_ready(name, version)
        except RequestError as e:
            return _json({"error": e.message}, e.status, e.headers if kind != "ready" else None)
        if why is None:
            return _json({"name": name, "ready": True})
        return _json({"name": name, "ready": False, "error": why}, 503)

    async def metrics(self, request: web.Request) -> web.Response:
        body = self.svc.exposition(self._open_connections())
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(self, request: web.Request) -> web.Response:
        status, body = self.svc.health_answer(request.path) or (404, {"error": "not found"})
        return _json(body, status)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _json(self.svc.server_metadata())

    def app(self, max_request_bytes: int) -> web.Application:
        app = web.Application(client_max_size=max_request_bytes + 1)
        r = app.router
        r.add_post("/v2/models/{name}/infer", self.infer)  # first: the hot path resolves soonest
        r.add_get("/v2/health/live", self.health)
        r.add_get("/v2/health/ready", self.health)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/metrics", self.metrics)
        for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            for suffix, kind in (("", "metadata"), ("/ready", "ready"), ("/config", "config")):
                r.add_get(base + suffix, functools.partial(self._answer, kind=kind))
        r.add_post("/v2/models/{name}/versions/{version}/infer", self.infer)
        return app
