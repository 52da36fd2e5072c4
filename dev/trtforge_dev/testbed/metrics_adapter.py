"""A small custom metrics API for the test bed: ``custom.metrics.k8s.io/v1beta1`` from the runtime
pods' own ``/metrics``, so the real HPA controller of the test bed can scale on them.

Development code, never in an image. It serves what prometheus-adapter serves with the rules in
docs/operations.md, for pods only: the runtime's gauges ``trtforge_runtime_requests_in_flight`` and
``trtforge_runtime_queue_depth`` as they are, and ``trtforge_runtime_requests_per_second``, the rate
of ``trtforge_runtime_requests_total`` between two reads of a pod. Each request lists the pods of the
namespace that match its label selector (through the apiserver), reads each Ready pod's ``/metrics``
at its IP on the container port named ``http``, and answers a MetricValueList.

The apiserver reaches it as an aggregated API (an APIService): :func:`register` writes the Service,
its Endpoints (this host's address: the test bed has no kube-proxy, and the apiserver runs with
``--enable-aggregator-routing``) and the APIService; :func:`unregister` removes them. It serves TLS
with the test bed's serving certificate (the APIService skips verifying it) and trusts whatever the
apiserver's front proxy sends: it is a test fixture on a loopback test bed, not an access boundary.

    python -m trtforge_dev.testbed.metrics_adapter --kubeconfig K --port P [--host H]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import socket
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from trtforge.logs import fields

log = logging.getLogger(__name__)

GROUP = "custom.metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
APISERVICE = f"{VERSION}.{GROUP}"
NAMESPACE = "trtforge-metrics"
SERVICE = "custom-metrics"
GAUGES = (
    "trtforge_runtime_requests_in_flight",
    "trtforge_runtime_queue_depth",
    "trtforge_llm_kv_cache_utilization",
)
RATE = "trtforge_runtime_requests_per_second"
COUNTER = "trtforge_runtime_requests"  # the family of trtforge_runtime_requests_total
METRICS = (*GAUGES, RATE)


def quantity(value: float) -> str:
    """A metric value as a Kubernetes quantity, in milli-units (``2500m``)."""
    return f"{round(value * 1000)}m"


def parse_pod_metrics(text: str, model: str | None = None) -> dict[str, float]:
    """The runtime's gauges (summed over models, or one `model`) and its request count, from one
    ``/metrics`` exposition: ``{name: value}`` with the counter under ``trtforge_runtime_requests``."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in GAUGES or fam.name == COUNTER:
            for s in fam.samples:
                if fam.name == COUNTER and not s.name.endswith("_total"):
                    continue
                if model is not None and s.labels.get("model") != model:
                    continue
                out[fam.name] = out.get(fam.name, 0.0) + float(s.value)
    return out


class Rates:
    """Per-second rates of a counter from successive reads of each pod: the first read gives 0, a read
    less than a second after the last gives the last rate again, a counter that went down (a restarted
    pod) gives 0."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float, float]] = {}  # key -> (count, at, rate)
        self._lock = threading.Lock()

    def rate(self, key: str, count: float, at: float) -> float:
        with self._lock:
            prev = self._last.get(key)
            if prev is not None and at - prev[1] < 1.0:
                return prev[2]
            r = 0.0 if prev is None or count < prev[0] else (count - prev[0]) / (at - prev[1])
            self._last[key] = (count, at, r)
            return r


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def _http_port(pod: Any) -> int | None:
    for c in pod.spec.containers:
        for p in c.ports or []:
            if p.name == "http":
                return int(p.container_port)
    return None


class Adapter:
    """Reads pods' metrics for the handler; one per server."""

    def __init__(self, api: client.ApiClient, scrape_timeout: float = 5.0) -> None:
        self.core: Any = client.CoreV1Api(api)
        self.rates = Rates()
        self.scrape_timeout = scrape_timeout

    def values(self, namespace: str, name: str, metric: str, selector: str) -> list[dict[str, Any]]:
        """The metric's value for each Ready pod of `namespace` matching `selector` (or named `name`)."""
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector or None).items
        items = []
        now = dt.datetime.now(dt.UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
        for pod in pods:
            if name != "*" and pod.metadata.name != name:
                continue
            if pod.metadata.deletion_timestamp is not None or not _ready(pod) or not pod.status.pod_ip:
                continue
            port = _http_port(pod)
            if port is None:
                continue
            try:
                with urllib.request.urlopen(
                    f"http://{pod.status.pod_ip}:{port}/metrics", timeout=self.scrape_timeout
                ) as r:
                    got = parse_pod_metrics(r.read().decode())
            except OSError as e:
                log.warning("could not read %s/%s: %s", namespace, pod.metadata.name, e)
                continue
            if metric == RATE:
                key = f"{namespace}/{pod.metadata.name}/{pod.metadata.uid}"
                value = self.rates.rate(key, got.get(COUNTER, 0.0), time.monotonic())
            elif metric in got:
                value = got[metric]
            else:
                continue
            items.append(
                {
                    "describedObject": {
                        "kind": "Pod",
                        "namespace": namespace,
                        "name": pod.metadata.name,
                        "apiVersion": "/v1",
                    },
                    "metricName": metric,
                    "timestamp": now,
                    "value": quantity(value),
                }
            )
        return items


def discovery() -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": f"pods/{m}",
                "singularName": "",
                "namespaced": True,
                "kind": "MetricValueList",
                "verbs": ["get"],
            }
            for m in METRICS
        ],
    }


def make_handler(adapter: Adapter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

        def _send(self, code: int, body: Mapping[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._send(
                code,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": reason,
                    "message": message,
                    "code": code,
                },
            )

        def do_GET(self) -> None:
            url = urlparse(self.path)
            parts = [unquote(p) for p in url.path.split("/") if p]  # the apiserver sends * as %2A
            if parts in (["healthz"], ["readyz"], ["livez"]):
                self.send_response(200)
                self.end_headers()
                return
            if parts == ["apis", GROUP, VERSION]:
                self._send(200, discovery())
                return
            if parts == ["apis", GROUP]:
                gv = {"groupVersion": GROUP_VERSION, "version": VERSION}
                self._send(
                    200,
                    {
                        "kind": "APIGroup",
                        "apiVersion": "v1",
                        "name": GROUP,
                        "versions": [gv],
                        "preferredVersion": gv,
                    },
                )
                return
            # /apis/custom.metrics.k8s.io/v1beta1/namespaces/<ns>/pods/<name|*>/<metric>
            if len(parts) == 8 and parts[:3] == ["apis", GROUP, VERSION] and parts[3] == "namespaces":
                _, _, _, _, ns, kind, name, metric = parts
                if kind != "pods" or metric not in METRICS:
                    self._status(404, "NotFound", f"the metric {metric} of {kind} is not served")
                    return
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                try:
                    items = adapter.values(ns, name, metric, selector)
                except ApiException as e:
                    self._status(500, "InternalError", f"listing pods: {e.status} {e.reason}")
                    return
                self._send(
                    200,
                    {
                        "kind": "MetricValueList",
                        "apiVersion": GROUP_VERSION,
                        "metadata": {"selfLink": url.path},
                        "items": items,
                    },
                )
                return
            self._status(404, "NotFound", f"{url.path} is not served here")

    return Handler


def serve(api: client.ApiClient, host: str, port: int, cert: str, key: str) -> ThreadingHTTPServer:
    """Start serving TLS on (host, port) in a thread; stop with ``shutdown()``."""
    server = ThreadingHTTPServer((host, port), make_handler(Adapter(api)))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="metrics-adapter", daemon=True).start()
    return server


def host_address() -> str:
    """An address of this host that the apiserver can dial and Endpoints accept (not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.254.254.254", 9))  # no packet is sent: this only picks the outgoing interface
        addr = str(s.getsockname()[0])
    if addr.startswith("127."):
        raise RuntimeError("no address but loopback: the apiserver cannot reach an aggregated API here")
    return addr


def register(api: client.ApiClient, host: str, port: int) -> None:
    """The Namespace, Service, Endpoints and APIService that route custom.metrics.k8s.io to us. A
    namespace left terminating by the last unregister is waited out first: nothing can be made in it."""
    from trtforge_dev.testbed.wait import wait_for

    core: Any = client.CoreV1Api(api)
    reg: Any = client.ApiregistrationV1Api(api)
    wait_for(lambda: not _terminating(core), timeout=180, desc=f"namespace {NAMESPACE} gone")
    for fn, args in (
        (core.create_namespace, ({"metadata": {"name": NAMESPACE}},)),
        (
            core.create_namespaced_service,
            (
                NAMESPACE,
                {
                    "metadata": {"name": SERVICE},
                    "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
                },
            ),
        ),
    ):
        try:
            fn(*args)
        except ApiException as e:
            if e.status != 409:
                raise
    endpoints: dict[str, Any] = {
        "metadata": {"name": SERVICE},
        "subsets": [{"addresses": [{"ip": host}], "ports": [{"name": "https", "port": port}]}],
    }
    try:
        core.create_namespaced_endpoints(NAMESPACE, endpoints)
    except ApiException as e:
        if e.status != 409:
            raise
        core.replace_namespaced_endpoints(SERVICE, NAMESPACE, endpoints)
    apiservice: dict[str, Any] = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": APISERVICE},
        "spec": {
            "group": GROUP,
            "version": VERSION,
            "service": {"namespace": NAMESPACE, "name": SERVICE, "port": 443},
            "insecureSkipTLSVerify": True,
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    try:
        reg.create_api_service(apiservice)
    except ApiException as e:
        if e.status != 409:
            raise
        cur = reg.read_api_service(APISERVICE)
        apiservice["metadata"]["resourceVersion"] = cur.metadata.resource_version
        reg.replace_api_service(APISERVICE, apiservice)


def available(api: client.ApiClient) -> bool:
    """The APIService is Available (the apiserver reached us)."""
    reg: Any = client.ApiregistrationV1Api(api)
    try:
        s = reg.read_api_service(APISERVICE)
    except ApiException:
        return False
    return any(c.type == "Available" and c.status == "True" for c in (s.status.conditions or []))


def _terminating(core: Any) -> bool:
    """Whether the adapter's namespace is still being deleted."""
    try:
        ns = core.read_namespace(NAMESPACE)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return ns.metadata.deletion_timestamp is not None


def unregister(api: client.ApiClient) -> None:
    """Remove the APIService and its namespace (Service and Endpoints with it)."""
    reg: Any = client.ApiregistrationV1Api(api)
    core: Any = client.CoreV1Api(api)
    for fn, args in ((reg.delete_api_service, (APISERVICE,)), (core.delete_namespace, (NAMESPACE,))):
        try:
            fn(*args)
        except ApiException as e:
            if e.status != 404:
                raise


def main(argv: list[str] | None = None) -> int:
    from trtforge.logs import configure_logging
    from trtforge_dev.testbed.kube import api_client
    from trtforge_dev.testbed.paths import StatePaths, default_root
    from trtforge_dev.testbed.pki import PKI

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default=None, help="address to serve and register (default: this host's)")
    p.add_argument("--root", default=None, help="the test bed's state root (its PKI serves TLS)")
    args = p.parse_args(argv)
    configure_logging("INFO", "json")
    host = args.host or host_address()
    pki = PKI(StatePaths(args.root).pki if args.root else StatePaths(default_root()).pki)
    api = api_client(Path(args.kubeconfig))
    server = serve(api, host, args.port, str(pki.serving_cert), str(pki.serving_key))
    register(api, host, args.port)
    log.info("custom metrics API serving", extra=fields(host=host, port=args.port))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


@contextlib.contextmanager
def registered(tb: Any, api: client.ApiClient) -> Iterator[None]:
    """This adapter serving test bed `tb` (a TestBed) and registered as the aggregated
    custom.metrics.k8s.io API through `api` until the block ends; then unregistered and stopped."""
    from trtforge_dev.testbed.pki import PKI
    from trtforge_dev.testbed.wait import wait_for

    pki = PKI(tb.paths.pki)
    host = host_address()
    own = tb.api_client()
    server = serve(own, host, 0, str(pki.serving_cert), str(pki.serving_key))
    try:
        register(api, host, int(server.server_address[1]))
        wait_for(lambda: available(api), timeout=120, desc="custom.metrics.k8s.io Available")
        yield
    finally:
        unregister(api)
        server.shutdown()
        own.close()
