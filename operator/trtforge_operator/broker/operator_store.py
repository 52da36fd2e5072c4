"""The broker's operator-only store endpoints: the whole store, read, written, listed and deleted for
the operator's ServiceAccount alone, so the operator pod mounts no claim (docs/design.md §"Store
claim that cannot bind"; the client is broker/store_client.py). Tenants' tokens get 403."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from trtforge.store import ObjectNotFound, StoreError
from trtforge.store.local import check_relpath
from trtforge_operator.store_reader import StoreReader

Authorize = Callable[[web.Request], Awaitable[web.Response | None]]  # None: the operator, go on


def add_operator_store_routes(
    app: web.Application, store: StoreReader, authorize: Authorize, count: Callable[[int], None]
) -> None:
    """`authorize` answers None for the operator and the refusal for anyone else."""

    def answer(status: int, error: str) -> web.Response:
        count(status)
        return web.json_response({"error": error}, status=status)

    def checked(path: str) -> str | None:
        try:
            return check_relpath(path)
        except StoreError:
            return None

    async def one(request: web.Request) -> web.StreamResponse:
        if (refused := await authorize(request)) is not None:
            return refused
        path = checked(request.match_info["path"])
        if path is None:
            return answer(400, "not a store path of plain names")
        s = store.store
        try:
            if request.method == "PUT":
                await asyncio.to_thread(s.put_bytes, path, await request.read())
                count(200)
                return web.json_response({"path": path})
            if request.method == "DELETE":
                await asyncio.to_thread(s.delete, path)
                count(200)
                return web.json_response({"path": path})
            if request.method == "HEAD":
                found = await asyncio.to_thread(s.exists, path)
                return answer(404, f"no {path}") if not found else _ok(count)
            data = await asyncio.to_thread(s.read_bytes, path)
        except ObjectNotFound:
            return answer(404, f"no {path}")
        except StoreError as e:
            return answer(502, str(e))
        count(200)
        return web.Response(body=data, content_type="application/octet-stream")

    async def listing(request: web.Request) -> web.Response:
        if (refused := await authorize(request)) is not None:
            return refused
        prefix = request.query.get("prefix", "")
        if prefix and checked(prefix.rstrip("/")) is None:
            return answer(400, "not a store prefix of plain names")
        try:
            paths = await asyncio.to_thread(store.store.list, prefix)
        except StoreError as e:
            return answer(502, str(e))
        count(200)
        return web.json_response({"paths": sorted(paths)})

    app.router.add_get("/store/", listing)
    for method in ("GET", "HEAD", "PUT", "DELETE"):
        app.router.add_route(method, "/store/{path:.+}", one)


def _ok(count: Callable[[int], None]) -> web.Response:
    count(200)
    return web.Response(status=200)
