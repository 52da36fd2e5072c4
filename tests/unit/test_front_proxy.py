"""The runtime's front proxy: its one config template, its limits derived from the runtime's settings,
the sidecar rendered into runtime pods, and the ConfigMap the plan writes before the Deployment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from trtforge_operator.apply import children
from trtforge_operator.apply.front_proxy import (
    ANNOTATION_CONFIG_HASH,
    CONFIG_KEY,
    SIDECAR,
    FrontProxyLimits,
    configmap_name,
    haproxy_config,
    pod_config,
)
from trtforge_operator.config import FrontProxySettings, OperatorConfig
from trtforge_operator.planning.deployment import plan_deployment
from trtforge_operator.planning.deployment_actions import (
    ApplyConfigMap,
    ApplyDeployment,
    ChildKind,
    DeleteChild,
)

from tests.unit.test_planning_deployment import CFG, engine, infd, observed

CHART_CONFIG = (
    Path(__file__).resolve().parents[2] / "charts" / "trtforge" / "files" / "runtime-front-proxy.cfg"
)
ON = CFG.model_copy(update={"front_proxy": FrontProxySettings(enabled=True, image="haproxy:test")})


def _config(limits: FrontProxyLimits) -> str:
    return haproxy_config(
        limits, http_port=8000, grpc_port=8001, runtime_http_port=18000, runtime_grpc_port=18001
    )


def _frontend(config: str, name: str) -> str:
    return config.split(f"frontend {name}\n", 1)[1].split("\n\n", 1)[0]


def test_limits_derive_from_the_runtimes_settings() -> None:
    default = FrontProxyLimits()
    assert default.streams_per_connection == 64  # the runtime's own share: a sixteenth of 1,024 slots
    assert default.grpc_connections_per_client == 4  # 4 x 64 = a quarter of the call slots
    assert default.http_connections_per_client == 256
    small = FrontProxyLimits(max_connections=256)
    assert (small.streams_per_connection, small.grpc_connections_per_client) == (16, 4)
    assert FrontProxyLimits(max_connections=8).grpc_connections_per_client == 2  # 2 x 1 of 8
    assert FrontProxyLimits(max_connections=4096).streams_per_connection == 100  # grpc.aio's cap


def test_the_config_carries_each_limit() -> None:
    lim = FrontProxyLimits(max_connections=256, idle_timeout_s=12.5, calls_per_client_per_second=300)
    cfg = _config(lim)
    assert "tune.h2.max-concurrent-streams 16" in cfg
    assert "timeout client 12500ms" in cfg and "timeout http-request 10000ms" in cfg
    grpc, http = _frontend(cfg, "grpc"), _frontend(cfg, "http")
    assert 'bind "${POD_IP}:8001" proto h2' in grpc and 'bind "${POD_IP}:8000"\n' in http
    assert "sc0_conn_cur gt 4 }" in grpc and "sc0_conn_cur gt 64 }" in http
    for fe in (grpc, http):
        assert "maxconn 256" in fe and "tcp-request connection track-sc0 src" in fe
        assert "sc0_http_req_rate gt 300 }" in fe
        assert f"content-length) gt {64 << 20} }}" in fe
    assert "!health" in http and "!health" not in grpc  # probes are never refused for their rate
    assert "server runtime 127.0.0.1:18001 proto h2" in cfg and "server runtime 127.0.0.1:18000 " in cfg
    assert "http-reuse never" in cfg.split("backend runtime_grpc", 1)[1]


def test_the_runtime_gets_the_same_limits() -> None:
    lim = FrontProxyLimits(max_connections=512, idle_timeout_s=20, max_request_bytes=1 << 20)
    args = lim.runtime_args()
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags == {
        "--max-connections": "512",
        "--idle-timeout": "20",
        "--max-request-bytes": str(1 << 20),
        "--grpc-message-timeout": "60",
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_connections", 0), ("idle_timeout_s", 0.0), ("calls_per_client_per_second", -1)],
)
def test_bad_limits_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"front proxy: {field} is {re.escape(str(value))}"):
        FrontProxyLimits(**{field: value})  # type: ignore[arg-type]


def test_the_charts_shipped_config_is_the_templates() -> None:
    text = CHART_CONFIG.read_text()
    shipped = "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith("#"))
    assert shipped == pod_config(FrontProxySettings(), 8000, 8001)


def _runtime(cfg: OperatorConfig) -> dict[str, object]:
    plan = plan_deployment(observed(infd(), engine()), cfg)
    (dep, *_) = [o for o in plan.apply if o["kind"] == "Deployment"]
    return dep


def test_off_by_default_the_pod_is_the_runtime_alone() -> None:
    pod = _runtime(CFG)["spec"]["template"]["spec"]  # type: ignore[index]
    assert [c["name"] for c in pod["containers"]] == ["serve"]
    plan = plan_deployment(observed(infd(), engine()), CFG)
    assert not [a for a in plan.actions if isinstance(a, ApplyConfigMap)]


def test_the_sidecar_takes_the_public_ports_and_the_runtime_moves_to_loopback() -> None:
    dep = _runtime(ON)
    template = dep["spec"]["template"]  # type: ignore[index]
    serve, proxy = template["spec"]["containers"]
    cmd = serve["command"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--port") + 1] == "18000" and cmd[cmd.index("--grpc-port") + 1] == "18001"
    assert cmd[cmd.index("--max-connections") + 1] == "1024"
    assert cmd.count("--host") == 1 and "ports" not in serve
    assert proxy["name"] == SIDECAR and proxy["image"] == "haproxy:test"
    assert proxy["env"] == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    assert [(p["name"], p["containerPort"]) for p in proxy["ports"]] == [("http", 8000), ("grpc", 8001)]
    # The probes stay the runtime's and reach its health through the proxy's port.
    assert serve["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8000}
    assert serve["livenessProbe"]["httpGet"]["port"] == 8000
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == SIDECAR]
    assert (
        volume["configMap"]["name"]
        == configmap_name(dep["metadata"]["name"])
        == (  # type: ignore[index]
            f"{dep['metadata']['name']}-front-proxy"  # type: ignore[index]
        )
    )
    assert proxy["securityContext"] == serve["securityContext"]  # restricted, as the runtime's
    assert template["metadata"]["annotations"][ANNOTATION_CONFIG_HASH]
    # Turning it on is a new spec hash: the Deployment is replaced, the pods roll.
    off = _runtime(CFG)
    key = children.ANNOTATION_SPEC_HASH
    assert dep["metadata"]["annotations"][key] != off["metadata"]["annotations"][key]  # type: ignore[index]


def test_the_plan_writes_each_configmap_before_its_deployment_every_pass() -> None:
    plan = plan_deployment(observed(infd(), engine()), ON)
    kinds = [type(a) for a in plan.actions if isinstance(a, ApplyConfigMap | ApplyDeployment)]
    assert kinds == [ApplyConfigMap, ApplyConfigMap, ApplyDeployment, ApplyDeployment]
    deps = {
        a.manifest["metadata"]["name"]: a.manifest for a in plan.actions if isinstance(a, ApplyDeployment)
    }
    for a in plan.actions:
        if not isinstance(a, ApplyConfigMap):
            continue
        cm = a.manifest
        (dep,) = [d for name, d in deps.items() if configmap_name(name) == cm["metadata"]["name"]]
        assert cm["metadata"]["namespace"] == "team-a"
        assert cm["metadata"]["ownerReferences"] == dep["metadata"]["ownerReferences"]
        assert cm["data"] == {CONFIG_KEY: pod_config(ON.front_proxy, 8000, 8001)}
    # A pass that finds the Deployments current still writes (reads, then skips) the ConfigMaps.
    from tests.unit.test_planning_deployment import live

    again = plan_deployment(observed(infd(), engine(), deployments=[live(d) for d in deps.values()]), ON)
    assert not [a for a in again.actions if isinstance(a, ApplyDeployment)]
    assert len([a for a in again.actions if isinstance(a, ApplyConfigMap)]) == 2


def test_a_removed_targets_configmap_goes_with_its_deployment() -> None:
    from tests.unit.test_planning_deployment import MIG, live

    both = plan_deployment(observed(infd(), engine()), ON)
    deps = [a.manifest for a in both.actions if isinstance(a, ApplyDeployment)]
    one = infd(targets=[{"gpu": MIG.gpu, "mig": MIG.mig, "replicas": 1}])
    for cfg, expected in ((ON, True), (CFG, False)):
        plan = plan_deployment(observed(one, engine(), deployments=[live(d) for d in deps]), cfg)
        gone = [a.name for a in plan.actions if isinstance(a, DeleteChild) and a.kind == ChildKind.DEPLOYMENT]
        (name,) = gone
        maps = [a.name for a in plan.actions if isinstance(a, DeleteChild) and a.kind == ChildKind.CONFIG_MAP]
        # Off, the operator has no ConfigMap rights (the chart grants them with the option): none deleted.
        assert maps == ([configmap_name(name)] if expected else [])
