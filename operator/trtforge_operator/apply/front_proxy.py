"""The runtime's front proxy: HAProxy in a sidecar on the pod's public HTTP and gRPC ports, the runtime
behind it on loopback (docs/security.md, "Hostile clients").

:func:`haproxy_config` is the one template (pure); its limits come from the runtime's own settings
(:class:`FrontProxyLimits`), which :func:`add_front_proxy` also passes to the runtime, so the two
never disagree. :func:`add_front_proxy` moves a rendered runtime pod behind the sidecar;
:func:`front_proxy_configmap` is the ConfigMap the operator owns beside the runtime Deployment.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trtforge_operator.config import FrontProxySettings

CONFIG_KEY = "haproxy.cfg"
CONFIG_DIR = "/usr/local/etc/haproxy"
SIDECAR = "front-proxy"
ANNOTATION_CONFIG_HASH = "trtforge.io/front-proxy-config"
# The runtime's ports behind the proxy, on loopback; the pod's public ports stay the proxy's.
INTERNAL_PORT_OFFSET = 10000


@dataclass(frozen=True)
class FrontProxyLimits:
    """The runtime's settings that the proxy's limits derive from (its `trtforge serve` defaults)."""

    max_connections: int = 1024  # --max-connections: the runtime's HTTP connections and gRPC call slots
    idle_timeout_s: float = 30.0  # --idle-timeout
    max_request_bytes: int = 64 << 20  # --max-request-bytes
    grpc_message_timeout_s: float = 60.0  # --grpc-message-timeout
    # Not a runtime setting: calls a second one client address may start on each port.
    calls_per_client_per_second: int = 200

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_request_bytes", "calls_per_client_per_second"):
            if getattr(self, name) < 1:
                raise ValueError(f"front proxy: {name} is {getattr(self, name)}, expected at least 1")
        for name in ("idle_timeout_s", "grpc_message_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"front proxy: {name} is {getattr(self, name)}, expected > 0 seconds")

    @property
    def streams_per_connection(self) -> int:
        """The runtime's own per-connection share: a sixteenth of the call slots, at most 100."""
        return max(1, min(100, self.max_connections // 16))

    @property
    def grpc_connections_per_client(self) -> int:
        """No client address holds more than a quarter of the call slots."""
        return max(1, self.max_connections // 4 // self.streams_per_connection)

    @property
    def http_connections_per_client(self) -> int:
        """An HTTP/1.1 connection holds one call: a quarter of the runtime's connections."""
        return max(1, self.max_connections // 4)

    def runtime_args(self) -> list[str]:
        """The `trtforge serve` flags that set the same limits in the runtime."""
        return [
            "--max-connections",
            str(self.max_connections),
            "--idle-timeout",
            _num(self.idle_timeout_s),
            "--max-request-bytes",
            str(self.max_request_bytes),
            "--grpc-message-timeout",
            _num(self.grpc_message_timeout_s),
        ]


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _ms(seconds: float) -> str:
    return f"{math.ceil(seconds * 1000)}ms"


def haproxy_config(
    limits: FrontProxyLimits,
    *,
    http_port: int,
    grpc_port: int,
    runtime_http_port: int,
    runtime_grpc_port: int,
    bind: str = "${POD_IP}",
    runtime_host: str = "127.0.0.1",
) -> str:
    """HAProxy's configuration for one runtime pod (HAProxy 2.6): per client address a connection cap
    and a call rate on each port, the runtime's per-connection stream share, a deadline for request
    heads, body size and idle limits; every HTTP/2 protocol violation is a connection error (GOAWAY).
    `bind` defaults to the pod's own address, as the runtime's `--host $(POD_IP)` (HAProxy expands
    the environment variable; unset, it listens on every address)."""
    lim = limits
    rate = lim.calls_per_client_per_second
    head_s = min(10.0, lim.idle_timeout_s)
    server_s = lim.grpc_message_timeout_s + 120.0  # a message's arrival, then the model run
    lines = [
        "global",
        f"  maxconn {4 * lim.max_connections + 64}",
        f"  tune.h2.max-concurrent-streams {lim.streams_per_connection}",
        "",
        "defaults",
        "  mode http",
        "  option http-keep-alive",
        "  timeout connect 2s",
        f"  timeout client {_ms(lim.idle_timeout_s)}",
        f"  timeout http-request {_ms(head_s)}",
        f"  timeout http-keep-alive {_ms(lim.idle_timeout_s)}",
        f"  timeout server {_ms(server_s)}",
        "",
    ]
    for name, port, per_client, backend in (
        ("http", http_port, lim.http_connections_per_client, f"{runtime_host}:{runtime_http_port}"),
        ("grpc", grpc_port, lim.grpc_connections_per_client, f"{runtime_host}:{runtime_grpc_port}"),
    ):
        h2 = name == "grpc"
        lines += [
            f"frontend {name}",
            f'  bind "{bind}:{port}"' + (" proto h2" if h2 else ""),
            f"  maxconn {lim.max_connections}",
            "  stick-table type ip size 100k expire 30s store conn_cur,conn_rate(1s),http_req_rate(1s)",
            "  tcp-request connection track-sc0 src",
            f"  tcp-request connection reject if {{ sc0_conn_cur gt {per_client} }}",
            f"  tcp-request connection reject if {{ sc0_conn_rate gt {rate} }}",
        ]
        if not h2:  # probes are never rate-limited; the connection cap still holds
            lines.append("  acl health path_beg /v2/health/")
        lines += [
            f"  http-request deny deny_status 429 if {{ sc0_http_req_rate gt {rate} }}"
            + ("" if h2 else " !health"),
            "  http-request deny deny_status 413 if "
            f"{{ req.hdr_val(content-length) gt {lim.max_request_bytes} }}",
            f"  default_backend runtime_{name}",
            "",
            f"backend runtime_{name}",
            # gRPC: each client connection its own runtime connections, so a client that stops reading
            # its answers (a zero window) stalls only its own streams, never another client's.
            "  http-reuse safe" if not h2 else "  http-reuse never",
            f"  server runtime {backend}" + (" proto h2" if h2 else "") + f" maxconn {lim.max_connections}",
            "",
        ]
    return "\n".join(lines)


def configmap_name(deployment: str) -> str:
    """The proxy's ConfigMap, named after the runtime Deployment it serves (one per Deployment)."""
    return f"{deployment}-front-proxy"


def _limits(settings: FrontProxySettings) -> FrontProxyLimits:
    return FrontProxyLimits(calls_per_client_per_second=settings.calls_per_client_per_second)


def pod_config(settings: FrontProxySettings, http_port: int, grpc_port: int) -> str:
    """The HAProxy configuration of a runtime pod whose public ports are `http_port` and `grpc_port`."""
    return haproxy_config(
        _limits(settings),
        http_port=http_port,
        grpc_port=grpc_port,
        runtime_http_port=http_port + INTERNAL_PORT_OFFSET,
        runtime_grpc_port=grpc_port + INTERNAL_PORT_OFFSET,
    )


def add_front_proxy(
    pod_spec: dict[str, Any],
    template_annotations: dict[str, str],
    settings: FrontProxySettings,
    *,
    http_port: int,
    grpc_port: int,
    configmap: str,
) -> None:
    """Put the proxy in front of the runtime in `pod_spec` (a rendered runtime pod, changed in place).

    The runtime (the first container) listens on 127.0.0.1 at the public ports plus
    :data:`INTERNAL_PORT_OFFSET` with the limits the proxy's derive from; the proxy takes the public
    ports. The probes keep their ports, so they reach the runtime's health through the proxy, as a
    client would, and a runtime that stops answering is still the container restarted. The config's
    hash is in the template's annotations: a new config rolls the pods."""
    serve = pod_spec["containers"][0]
    args = serve["args"] if "args" in serve else serve["command"]
    flags = ["--host", "127.0.0.1", "--port", str(http_port + INTERNAL_PORT_OFFSET)]
    flags += ["--grpc-port", str(grpc_port + INTERNAL_PORT_OFFSET), *_limits(settings).runtime_args()]
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    sidecar: dict[str, Any] = {
        "name": SIDECAR,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["haproxy", "-db", "-f", f"{CONFIG_DIR}/{CONFIG_KEY}"],
        "ports": serve.pop("ports", []),
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "volumeMounts": [{"name": SIDECAR, "mountPath": CONFIG_DIR, "readOnly": True}],
        "securityContext": copy.deepcopy(serve.get("securityContext", {})),
    }
    if settings.resources:
        sidecar["resources"] = copy.deepcopy(settings.resources)
    pod_spec["containers"].append(sidecar)
    pod_spec.setdefault("volumes", []).append({"name": SIDECAR, "configMap": {"name": configmap}})
    config = pod_config(settings, http_port, grpc_port)
    template_annotations[ANNOTATION_CONFIG_HASH] = hashlib.sha256(config.encode()).hexdigest()[:16]


def front_proxy_configmap(
    deployment: Mapping[str, Any], settings: FrontProxySettings, *, http_port: int, grpc_port: int
) -> dict[str, Any]:
    """The ConfigMap of a rendered runtime Deployment's proxy, with the Deployment's labels and owner."""
    meta = deployment["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": dict(meta.get("labels", {})),
            "ownerReferences": copy.deepcopy(meta["ownerReferences"]),
        },
        "data": {CONFIG_KEY: pod_config(settings, http_port, grpc_port)},
    }
