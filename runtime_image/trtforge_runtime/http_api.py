"""The v2 protocol over HTTP/1.1 (aiohttp): decodes requests for the service and encodes its answers.

Endpoints (KServe Open Inference Protocol v2, plus /metrics): ``/v2/health/live``,
``/v2/health/ready``, ``/v2``, ``/v2/models/{name}[/versions/{v}]``, ``.../ready``, ``.../config``,
``.../infer``. Errors are ``{"error": "..."}`` with 400 (bad request), 404 (unknown model), 408 (body
slower than ``--body-timeout``), 413 (body, decompressed body or JSON over its limit), 415 (a
Content-Encoding other than gzip, deflate, identity), 503 (not ready, draining, queue full, or too
many large bodies at once, with Retry-After) and 500 (execution failed).

Request limits (docs/design.md, "Runtime request limits"): the header's declarations are checked
against the model before any data is decoded; bodies are read undecoded within the size limit and a
memory budget shared by all requests; decompression and large decodes run in worker threads, so the
event loop keeps answering health probes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST

from trtforge_runtime.body import Coding, body_deadline, content_coding, read_body
from trtforge_runtime.errors import RequestError
from trtforge_runtime.inflate import inflate
from trtforge_runtime.metrics import exposition
from trtforge_runtime.service import Call, Service
from trtforge_runtime.v2 import HEADER_LENGTH, encode_response

log = logging.getLogger(__name__)
JSON = "application/json"


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, body=json.dumps({"error": message}).encode(), content_type=JSON, headers=headers
    )


def _ok(obj: dict[str, Any]) -> web.Response:
    return web.Response(body=json.dumps(obj).encode(), content_type=JSON)


def _not_ready(body: dict[str, object]) -> web.Response:
    return web.Response(status=503, content_type=JSON, body=json.dumps(body).encode())


class HttpApi:
    def __init__(self, service: Service, open_connections: Callable[[], int]) -> None:
        self.svc = service
        self._open_connections = open_connections

    def _name(self, request: web.Request) -> tuple[str, str | None]:
        return request.match_info["name"], request.match_info.get("version")

    async def live(self, request: web.Request) -> web.Response:
        return _ok({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        why = self.svc.not_ready_reason()
        return _ok({"ready": True}) if why is None else _not_ready({"ready": False, "error": why})

    async def server_metadata(self, request: web.Request) -> web.Response:
        return _ok(self.svc.server_metadata())

    async def model_metadata(self, request: web.Request) -> web.Response:
        try:
            return _ok(self.svc.model_spec_for(*self._name(request)).metadata())
        except RequestError as e:
            return _error(e.status, e.message, e.headers)

    async def model_ready(self, request: web.Request) -> web.Response:
        name, version = self._name(request)
        try:
            why = self.svc.model_ready(name, version)
        except RequestError as e:
            return _error(e.status, e.message)
        if why is None:
            return _ok({"name": name, "ready": True})
        return _not_ready({"name": name, "ready": False, "error": why})

    async def model_config(self, request: web.Request) -> web.Response:
        try:
            return _ok(self.svc.config_for(*self._name(request)))
        except RequestError as e:
            return _error(e.status, e.message, e.headers)

    async def metrics(self, request: web.Request) -> web.Response:
        m = self.svc.metrics
        if self.svc.batcher is not None:
            m.queue_depth_m.set(self.svc.batcher.depth)
        m.open_connections.set(self._open_connections())
        return web.Response(body=exposition(m), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _receive(self, request: web.Request, coding: Coding, call: Call) -> bytes | bytearray:
        """The body, identity-coded: its bytes as sent, and as inflated (inflate.inflate), held in the
        shared budget as they arrive (`call` releases them), within a deadline that fits its claimed
        size (body.body_deadline)."""
        s, bodies = self.svc.s, self.svc.bodies
        limit = s.max_request_bytes
        cl = request.content_length
        if cl is not None and cl > limit:
            raise RequestError(413, f"request body of {cl} bytes exceeds the limit of {limit} bytes")

        deadline = body_deadline(cl, s.body_timeout_s)
        reader = bodies.reader()
        try:
            async with asyncio.timeout(deadline):
                raw = await read_body(request.content, cl, limit, reader.take)
        except TimeoutError as e:
            raise RequestError(
                408,
                f"the request body did not arrive within {deadline:g} s (--body-timeout, or less for a"
                f" body of {cl} bytes)",
            ) from e
        except RequestPayloadError as e:
            raise RequestError(400, f"request body is malformed: {e}") from e
        finally:
            call.reserved += reader.keep()
            reader.close()
        if coding is Coding.IDENTITY:
            return raw
        reader = bodies.reader()  # inflated step by step, each step's bytes held as they are made
        try:
            return await inflate(raw, coding, limit, reader.take, self.svc.decode_pool)
        finally:
            call.reserved += reader.keep()
            reader.close()

    async def infer(self, request: web.Request) -> web.Response:
        svc = self.svc
        try:
            with svc.call() as call:
                spec = svc.admit(*self._name(request))
                coding = content_coding(request.headers.get("Content-Encoding"))
                hl = request.headers.get(HEADER_LENGTH)
                try:
                    header_length = int(hl) if hl is not None else None
                except ValueError as e:
                    raise RequestError(400, f"{HEADER_LENGTH} {hl!r} is not an integer") from e
                raw = await self._receive(request, coding, call)
                req, rows = await svc.decode_body(raw, Coding.IDENTITY, header_length, spec)
                del raw
                results = await svc.infer(req.inputs, rows)
                out, out_hl = encode_response(spec, req, results)
        except RequestError as e:
            refused = _error(e.status, e.message, e.headers)
            if not request.content.is_eof():  # a body left unread: the connection cannot go on
                refused.force_close()
            return refused
        except Exception as e:
            log.exception("inference failed")
            return _error(500, f"inference failed: {e}")
        if out_hl is None:
            return web.Response(body=out, content_type=JSON)
        return web.Response(
            body=out, headers={HEADER_LENGTH: str(out_hl), "Content-Type": "application/octet-stream"}
        )

    def app(self, max_request_bytes: int) -> web.Application:
        app = web.Application(client_max_size=max_request_bytes + 1)
        r = app.router
        r.add_post("/v2/models/{name}/infer", self.infer)  # first: the hot path resolves soonest
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/metrics", self.metrics)
        for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            r.add_get(base, self.model_metadata)
            r.add_get(base + "/ready", self.model_ready)
            r.add_get(base + "/config", self.model_config)
        r.add_post("/v2/models/{name}/versions/{version}/infer", self.infer)
        return app
