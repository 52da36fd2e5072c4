"""The engine broker: serves stored engines to runtime pods, so tenants never hold store credentials.

URL scheme (the read-only client is :mod:`trtforge.store.http`)::

    GET  /engines/<key>/<file>   the bytes (X-Trtforge-Sha256 for the engine file)
    HEAD /engines/<key>/<file>   200 when it exists
    GET  /engines/<key>/         {"files": [...]}

A request carries ``Authorization: Bearer <projected service-account token>`` (audience from the
config). The broker asks the apiserver (TokenReview) who it is: ``system:serviceaccount:<ns>:<sa>``,
with the pod name in the token's extra info. It is allowed only when an InferenceDeployment in
``<ns>`` references a TRTEngine (same namespace) whose status lists that engine key. 401 without a
valid token, 403 when the namespace has no claim on the key, 404 when the store has no such file.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from trtforge.contract.layout import KEY_RE, engine_path, manifest_path
from trtforge.contract.manifest import Manifest
from trtforge.logs import fields
from trtforge.store import ObjectNotFound, StoreError
from trtforge_operator.config import OperatorConfig
from trtforge_operator.kube import Kube
from trtforge_operator.labels import INFERENCEDEPLOYMENTS, TRTENGINES
from trtforge_operator.metrics import Metrics
from trtforge_operator.store_reader import StoreReader

log = logging.getLogger(__name__)
SA_PREFIX = "system:serviceaccount:"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
SHA256_HEADER = "X-Trtforge-Sha256"
AUTH_TTL_S = 5.0


class Denied(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Authorizer = Callable[[str, str], Awaitable[str]]  # (token, key) -> who (for logs); raises Denied


def namespace_of(username: str) -> str | None:
    if not username.startswith(SA_PREFIX):
        return None
    ns, _, sa = username.removeprefix(SA_PREFIX).partition(":")
    return ns if ns and sa else None


def keys_referenced(infds: list[dict[str, Any]], engines: dict[str, dict[str, Any]]) -> set[str]:
    """Engine keys the InferenceDeployments of one namespace may read (via their same-namespace engines)."""
    out: set[str] = set()
    for d in infds:
        ref = ((d.get("spec") or {}).get("engineRef") or {}).get("name")
        e = engines.get(ref or "")
        if e is None:
            continue
        for t in (e.get("status") or {}).get("targets") or []:
            if t.get("engineKey"):
                out.add(str(t["engineKey"]))
    return out


class KubeAuthorizer:
    """TokenReview + the InferenceDeployments/TRTEngines of the token's namespace, cached briefly."""

    def __init__(self, kube: Kube, audience: str) -> None:
        self.kube = kube
        self.audience = audience
        self._tokens: dict[str, tuple[float, str, str]] = {}
        self._keys: dict[str, tuple[float, set[str]]] = {}

    async def _who(self, token: str) -> tuple[str, str]:
        hit = self._tokens.get(token)
        if hit and time.monotonic() - hit[0] < AUTH_TTL_S:
            return hit[1], hit[2]
        st = await self.kube.token_review(token, self.audience)
        if not st.get("authenticated"):
            raise Denied(401, f"token not accepted: {st.get('error') or 'not authenticated'}")
        user = st.get("user") or {}
        ns = namespace_of(str(user.get("username", "")))
        if ns is None:
            raise Denied(403, f"{user.get('username')} is not a service account")
        pod = ((user.get("extra") or {}).get(POD_NAME_EXTRA) or [""])[0]
        self._tokens[token] = (time.monotonic(), ns, pod)
        return ns, pod

    async def _keys_of(self, ns: str) -> set[str]:
        hit = self._keys.get(ns)
        if hit and time.monotonic() - hit[0] < AUTH_TTL_S:
            return hit[1]
        infds = await self.kube.list_custom(INFERENCEDEPLOYMENTS, ns)
        engines = {e["metadata"]["name"]: e for e in await self.kube.list_custom(TRTENGINES, ns)}
        keys = keys_referenced(infds, engines)
        self._keys[ns] = (time.monotonic(), keys)
        return keys

    async def __call__(self, token: str, key: str) -> str:
        ns, pod = await self._who(token)
        if key not in await self._keys_of(ns):
            self._keys.pop(ns, None)  # a just-created reference may not be cached yet
            if key not in await self._keys_of(ns):
                raise Denied(403, f"namespace {ns} has no InferenceDeployment serving engine {key[:12]}")
        return f"{ns}/{pod}" if pod else ns


def make_app(
    store: StoreReader, authorize: Authorizer | None, metrics: Metrics | None = None
) -> web.Application:
    """The broker's aiohttp application; `authorize` None serves anyone (local debugging only)."""

    async def _check(request: web.Request, key: str) -> str:
        if not KEY_RE.match(key):
            raise Denied(404, "not an engine key")
        if authorize is None:
            return "anonymous"
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            raise Denied(401, "no bearer token")
        return await authorize(auth.removeprefix("Bearer ").strip(), key)

    def _count(code: int) -> None:
        if metrics is not None:
            metrics.broker_requests.labels(str(code)).inc()

    async def get_file(request: web.Request) -> web.StreamResponse:
        key, name = request.match_info["key"], request.match_info["file"]
        try:
            who = await _check(request, key)
        except Denied as e:
            _count(e.status)
            return web.json_response({"error": str(e)}, status=e.status)
        if "/" in name or name.startswith("."):
            _count(404)
            return web.json_response({"error": "no such file"}, status=404)
        path = engine_path(key, name)
        try:
            exists = await asyncio.to_thread(store.store.exists, path)
        except StoreError as e:
            _count(502)
            return web.json_response({"error": str(e)}, status=502)
        if not exists:
            _count(404)
            return web.json_response({"error": f"no {name} in engine {key[:12]}"}, status=404)
        headers: dict[str, str] = {}
        m = await asyncio.to_thread(store.manifest, key)
        if isinstance(m, Manifest) and m.engine_file == name:
            headers[SHA256_HEADER] = m.sha256
        if request.method == "HEAD":
            _count(200)
            return web.Response(status=200, headers=headers)
        resp = web.StreamResponse(status=200, headers={**headers, "Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        it = iter(store.store.iter_chunks(path))
        try:
            while True:
                chunk = await asyncio.to_thread(next, it, None)
                if chunk is None:
                    break
                await resp.write(chunk)
        except (ObjectNotFound, StoreError) as e:
            log.warning("broker: %s failed mid-stream: %s", path, e)
            raise
        await resp.write_eof()
        _count(200)
        log.info("broker served %s to %s", path, who, extra=fields(key=key, file=name, client=who))
        return resp

    async def list_files(request: web.Request) -> web.Response:
        key = request.match_info["key"]
        try:
            await _check(request, key)
        except Denied as e:
            _count(e.status)
            return web.json_response({"error": str(e)}, status=e.status)
        try:
            paths = await asyncio.to_thread(store.store.list, f"engines/{key}/")
        except StoreError as e:
            _count(502)
            return web.json_response({"error": str(e)}, status=502)
        if manifest_path(key) not in paths:
            _count(404)
            return web.json_response({"error": f"no engine {key[:12]}"}, status=404)
        _count(200)
        return web.json_response({"files": sorted(p.rsplit("/", 1)[-1] for p in paths)})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/engines/{key}/", list_files)
    app.router.add_route("GET", "/engines/{key}/{file}", get_file)
    app.router.add_route("HEAD", "/engines/{key}/{file}", get_file)
    return app


async def start_broker(
    cfg: OperatorConfig, store: StoreReader, kube: Kube, metrics: Metrics
) -> web.AppRunner:
    auth: Authorizer | None = (
        KubeAuthorizer(kube, cfg.broker.audience) if cfg.broker.auth == "tokenreview" else None
    )
    runner = web.AppRunner(make_app(store, auth, metrics), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.broker.host, cfg.broker.port)
    await site.start()
    log.info(
        "engine broker listening on %s:%s",
        cfg.broker.host,
        cfg.broker.port,
        extra=fields(url=cfg.broker_url()),
    )
    return runner
