"""The broker client over several endpoints (no Service IPs): it tries them in turn, and a download
that breaks midway goes on from another endpoint without ever producing a spliced or unverified file.

Real sockets: the engine broker's own app (open access) over a real store, plus a stand-in for a
replica that dies midway (it sends half the file, then drops the connection)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from trtforge_dev.testbed.procs import free_port
from trtforge_operator.broker import make_app
from trtforge_operator.store_reader import StoreReader

from trtforge.contract.layout import engine_path
from trtforge.store import IntegrityError, StoreError, open_store
from trtforge.store.http import BrokerStore

KEY = "e" * 64
DATA = bytes(range(256)) * 40_000  # ~10 MB
PATH = engine_path(KEY, "model-1.onnx")


class Servers:
    """aiohttp apps on real ports, in a background event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runners: list[web.AppRunner] = []

    def serve(self, app: web.Application) -> str:
        port = free_port()

        async def start() -> None:
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)

        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        return f"http://127.0.0.1:{port}"

    def close(self) -> None:
        for r in self.runners:
            asyncio.run_coroutine_threadsafe(r.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def servers() -> Iterator[Servers]:
    s = Servers()
    try:
        yield s
    finally:
        s.close()


def _broker(tmp_path: Path) -> web.Application:
    store = open_store(str(tmp_path / "store"))
    store.put_bytes(PATH, DATA)
    return make_app(StoreReader(str(tmp_path / "store")), None)


def _dies_midway(data: bytes, served: list[int]) -> web.Application:
    async def half(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": str(len(data))})
        await resp.prepare(request)
        await resp.write(data[: len(data) // 2])
        served.append(len(data) // 2)
        assert request.transport is not None
        request.transport.abort()  # the replica is gone: the connection drops mid-body
        return resp

    app = web.Application()
    app.router.add_get("/engines/{key}/{file}", half)
    return app


def test_a_download_that_breaks_midway_goes_on_from_another_endpoint(
    servers: Servers, tmp_path: Path
) -> None:
    served: list[int] = []
    dying = servers.serve(_dies_midway(DATA, served))
    good = servers.serve(_broker(tmp_path))
    store = BrokerStore(f"{dying},{good}", token_file="", backoff_s=0.01)
    buf = io.BytesIO()
    got = store.get(PATH, buf, expected_sha256=hashlib.sha256(DATA).hexdigest())
    assert served == [len(DATA) // 2], "the first endpoint really broke midway"
    assert buf.getvalue() == DATA and got.size_bytes == len(DATA)
    assert store.endpoints[store._current] == good  # later requests start with the one that answered


def test_a_dead_endpoint_is_skipped_and_a_changed_file_is_never_spliced(
    servers: Servers, tmp_path: Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    good = servers.serve(_broker(tmp_path))
    store = BrokerStore(f"{dead},{good}", token_file="", backoff_s=0.01)
    assert store.read_bytes(PATH) == DATA
    # A replica that dies midway while the other serves *other* bytes under the same name: the
    # whole-file check refuses the result.
    other = tmp_path / "other"
    open_store(str(other / "store")).put_bytes(PATH, DATA[::-1])
    served: list[int] = []
    dying = servers.serve(_dies_midway(DATA, served))
    changed = servers.serve(make_app(StoreReader(str(other / "store")), None))
    spliced = BrokerStore(
        f"{dying},{changed}",
        token_file="",
        backoff_s=0.01,
    )
    with pytest.raises(IntegrityError):
        spliced.get(PATH, io.BytesIO(), expected_sha256=hashlib.sha256(DATA).hexdigest())


def test_no_endpoint_answering_fails_after_the_rounds_with_the_reason() -> None:
    store = BrokerStore(
        f"http://127.0.0.1:{free_port()},http://127.0.0.1:{free_port()}",
        token_file="",
        retry_rounds=2,
        backoff_s=0.01,
    )
    with pytest.raises(StoreError, match="no engine broker answered"):
        store.read_bytes(PATH)
    assert json.dumps(store.endpoints)  # the list is what was given, in order
