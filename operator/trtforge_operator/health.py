"""/healthz of an operator replica: alive and ready whether it leads or waits (a standby is ready).

The answer says which: ``{"identity": ..., "leader": true|false}``. It is served by every replica
from the start, not by kopf (which runs only on the leader).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web


def health_app(
    identity: str, leading: Callable[[], bool] | None, wedged: Callable[[], str | None] | None = None
) -> web.Application:
    """`leading` None: no leader election (the replica always acts). `wedged` says why the reconcile
    loops are stuck (answered 503, so the kubelet restarts the replica), or None while they progress."""

    async def healthz(_: web.Request) -> web.Response:
        leader = True if leading is None else leading()
        problem = wedged() if wedged is not None and leader else None
        body = {"identity": identity, "leader": leader}
        if problem is not None:
            return web.json_response({**body, "wedged": problem}, status=503)
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    return app


async def start_health(
    host: str,
    port: int,
    identity: str,
    leading: Callable[[], bool] | None,
    wedged: Callable[[], str | None] | None = None,
) -> web.AppRunner:
    runner = web.AppRunner(health_app(identity, leading, wedged), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
