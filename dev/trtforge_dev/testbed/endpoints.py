"""A Service's ready `openai` endpoints on the test bed, read from its EndpointSlices (the test bed
has no kube-proxy, and its pod IPs are loopback addresses, which the Endpoints API refuses to hold)."""

from __future__ import annotations

from typing import Any


def openai_addresses(api: Any, ns: str, service: str) -> list[tuple[str, int]]:
    """(pod IP, port) of `service`'s `openai` port for each ready endpoint."""
    from kubernetes import client

    co: Any = client.CustomObjectsApi(api)
    sel = f"kubernetes.io/service-name={service}"
    slices = co.list_namespaced_custom_object(
        "discovery.k8s.io", "v1beta1", ns, "endpointslices", label_selector=sel
    )
    out = []
    for sl in slices["items"]:
        port = next((p["port"] for p in sl.get("ports") or [] if p.get("name") == "openai"), None)
        for ep in sl.get("endpoints") or []:
            if port is not None and (ep.get("conditions") or {}).get("ready"):
                out += [(str(a), int(port)) for a in ep["addresses"]]
    return out
