"""The operator's Kubernetes client on the test bed's real apiserver: calls whose answers it does not
parse (Job, Service and Event creates, deletes) still hand their connection back to the pool. An
unread answer kept its connection, so each such call opened a new TLS connection to the apiserver
(docs/design.md §"Scale"). And the one ConfigMap write, the front proxy's: only a difference is written."""

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


@pytest.mark.asyncio
async def test_a_configmap_is_created_left_alone_and_replaced_on_a_new_config(
    testbed: TestBed, namespace: str
) -> None:
    """The front proxy's ConfigMap (apply/front_proxy.py), written every pass: created once, left as
    it is while its data is the same, replaced when the config changes; deleted with its Deployment."""
    with testbed.api_client() as api:
        kube = Kube(api, threads=1)
        cm: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "runtime-front-proxy", "namespace": namespace},
            "data": {"haproxy.cfg": "global\n"},
        }
        assert await kube.apply_config_map(cm) == "created"
        read = await kube._call(kube.core.read_namespaced_config_map, "runtime-front-proxy", namespace)
        assert await kube.apply_config_map(cm) == "unchanged"
        again = await kube._call(kube.core.read_namespaced_config_map, "runtime-front-proxy", namespace)
        assert again.metadata.resource_version == read.metadata.resource_version
        assert (
            await kube.apply_config_map({**cm, "data": {"haproxy.cfg": "global\n  maxconn 8\n"}})
            == "replaced"
        )
        now = await kube._call(kube.core.read_namespaced_config_map, "runtime-front-proxy", namespace)
        assert now.data == {"haproxy.cfg": "global\n  maxconn 8\n"}
        assert await kube.delete("ConfigMap", namespace, "runtime-front-proxy")
        assert not await kube.delete("ConfigMap", namespace, "runtime-front-proxy")  # 404: gone
