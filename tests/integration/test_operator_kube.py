"""The operator's Kubernetes client on the test bed's real apiserver: calls whose answers it does not
parse (Job, Service and Event creates, deletes) still hand their connection back to the pool. An
unread answer kept its connection, so each such call opened a new TLS connection to the apiserver
(docs/design.md §"Scale")."""

from __future__ import annotations

from typing import Any

import pytest
from trtforge_dev.testbed.handle import TestBed
from trtforge_operator.kube import Kube

pytestmark = pytest.mark.integration


def _connections_opened(kube: Kube) -> int:
    pools = kube.api.rest_client.pool_manager.pools
    return sum(p.num_connections for p in pools._container.values())


@pytest.mark.asyncio
async def test_unparsed_calls_reuse_their_connection(testbed: TestBed, namespace: str) -> None:
    with testbed.api_client() as api:
        kube = Kube(api, threads=1)
        service: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "probe", "namespace": namespace},
            "spec": {"ports": [{"port": 80}]},
        }
        assert await kube.create(service)
        assert not await kube.create(service)  # 409: already there
        for i in range(5):
            await kube.event(service, "Normal", "Probe", f"probe {i}")
        assert await kube.delete("Service", namespace, "probe")
        assert not await kube.delete("Service", namespace, "probe")  # 404: gone
        # Nine calls on one thread, one after the other: one connection serves them all.
        assert _connections_opened(kube) == 1
