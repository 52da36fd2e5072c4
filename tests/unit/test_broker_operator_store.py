"""The operator's store through the broker: its client over the broker app on a real local server and a
real local store; only the operator's ServiceAccount may use it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer
from trtforge_operator.broker import Denied, Identity, make_app
from trtforge_operator.broker.server import operator_denial
from trtforge_operator.broker.store_client import OperatorBrokerStore
from trtforge_operator.store_reader import StoreReader

from trtforge.contract.possession import VerifyGrant, verify_grant_path
from trtforge.store import ObjectNotFound, StoreError, open_store
from trtforge.store.http import BrokerDenied

OPERATOR = ("trtforge-system", "trtforge")
IDENTITIES = {
    "operator": Identity("trtforge-system", "op-pod", "", "trtforge"),
    "broker": Identity("trtforge-system", "broker-pod", "", "trtforge-broker"),  # another SA, same ns
    "tenant": Identity("team-a", "pod", "", "trtforge"),  # the operator's SA name, another namespace
}


def test_only_the_operators_service_account_may_use_the_store_endpoints() -> None:
    assert operator_denial(IDENTITIES["operator"], OPERATOR) is None
    for who in ("broker", "tenant"):
        d = operator_denial(IDENTITIES[who], OPERATOR)
        assert d is not None and d.status == 403 and "trtforge-system/trtforge" in str(d)
    off = operator_denial(IDENTITIES["operator"], None)
    assert off is not None and off.status == 403 and "operator_service_account" in str(off)


class Tokens:
    """Tokens -> identities (the TokenReview stand-in), then the broker's real operator rule."""

    async def identify(self, token: str) -> Identity:
        if token not in IDENTITIES:
            raise Denied(401, "bad token")
        return IDENTITIES[token]

    async def check_engine(self, who: Identity, key: str) -> None:
        raise Denied(403, "no engines here")

    async def check_upload(self, who: Identity, sha256: str, length: int | None) -> VerifyGrant:
        raise Denied(403, "no uploads here")

    def check_operator(self, who: Identity) -> None:
        if (why := operator_denial(who, OPERATOR)) is not None:
            raise why


@pytest_asyncio.fixture
async def broker_url(tmp_path: Path) -> AsyncIterator[str]:
    store = StoreReader(str(tmp_path / "store"))
    server = TestServer(make_app(store, Tokens()))
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def _client(url: str, tmp_path: Path, token: str | None) -> OperatorBrokerStore:
    f = tmp_path / f"token-{token}"
    if token is not None:
        f.write_text(token)
    return OperatorBrokerStore(url, token_file=str(f) if token else "", retry_rounds=1, backoff_s=0)


@pytest.mark.asyncio
async def test_the_operator_reads_writes_lists_and_deletes_the_store(broker_url: str, tmp_path: Path) -> None:
    op = _client(broker_url, tmp_path, "operator")
    path = verify_grant_path("team-a", "trtforge-verify-x")

    def walk() -> None:
        op.put_bytes(path, b'{"x": 1}')
        op.put_bytes("engines/" + "e" * 64 + "/manifest.json", b"{}")
        assert op.read_bytes(path) == b'{"x": 1}'
        assert op.exists(path) and not op.exists("verify-grants/none.json")
        assert op.list("verify-grants/") == [path]
        assert op.list("") == sorted([path, "engines/" + "e" * 64 + "/manifest.json"])
        op.delete(path)
        op.delete(path)  # already gone: no error
        with pytest.raises(ObjectNotFound):
            op.read_bytes(path)

    await asyncio.to_thread(walk)
    # What the broker wrote is in the store itself, where build Jobs and the broker see it.
    assert open_store(str(tmp_path / "store")).list("engines/") == ["engines/" + "e" * 64 + "/manifest.json"]


@pytest.mark.asyncio
@pytest.mark.parametrize("token", ["tenant", "broker", None, "forged"])
async def test_anyone_else_is_refused_every_store_endpoint(
    broker_url: str, tmp_path: Path, token: str | None
) -> None:
    open_store(str(tmp_path / "store")).put_bytes("possession/team-a/x.json", b"{}")
    c = _client(broker_url, tmp_path, token)
    calls: list[Any] = [
        lambda: c.read_bytes("possession/team-a/x.json"),
        lambda: c.list("possession/"),
        lambda: c.put_bytes("possession/team-a/x.json", b"forged"),
        lambda: c.delete("possession/team-a/x.json"),
    ]
    for call in calls:
        with pytest.raises(BrokerDenied):
            await asyncio.to_thread(call)
    assert open_store(str(tmp_path / "store")).read_bytes("possession/team-a/x.json") == b"{}"


def test_paths_outside_the_store_are_refused_before_any_request() -> None:
    c = OperatorBrokerStore("http://127.0.0.1:9", retry_rounds=1, backoff_s=0)
    for bad in ("../etc/passwd", "/abs", "a/./b"):
        with pytest.raises(StoreError):
            c.read_bytes(bad)
