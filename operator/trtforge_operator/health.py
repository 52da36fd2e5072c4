"""/healthz of an operator replica: alive and ready whether it leads or waits (a standby is ready).

The answer says which: ``{"identity": ..., "leader": true|false}``. It is served by every replica
from the start, not by kopf (which runs only on the leader).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web


def health_app(identity: str, leading: Callable[[], bool] | None) -> web.Application:
    """`leading` None: no leader election (the replica always acts)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"identity": identity, "leader": True if leading is None else leading()})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    return app


async def start_health(
    host: str, port: int, identity: str, leading: Callable[[], bool] | None
) -> web.AppRunner:
    runner = web.AppRunner(health_app(identity, leading), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
