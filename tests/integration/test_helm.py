"""The chart through a real Helm (4.1.4, trtforge_dev.testbed.helm) and its alerts through promtool.

- `helm lint`, and `helm template` of every ci/*-values.yaml;
- the schema's and the templates' refusals, as Helm reports them;
- the PrometheusRule's alerts, unit-tested with `promtool test rules` (Debian's prometheus package)
  against series built from what the operator's and the runtime's metrics classes really export;
- the PodDisruptionBudgets' API follows the cluster's (policy/v1, or policy/v1beta1 before 1.21).

The rendered chart applied to the test bed (operator and broker replicas running) is in test_ha.py
and test_broker_ha.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from trtforge_dev.testbed.chart import CHART, helm, render

pytestmark = [pytest.mark.integration]

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


def test_helm_lint() -> None:
    r = helm("lint", str(CHART))
    assert "0 chart(s) failed" in r.stdout


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name)
def test_helm_template_renders_each_ci_values_file(values: Path) -> None:
    docs, _ = render("ci", "trtforge-system", None, values)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ConfigMap", "ClusterRole", "Role", "RoleBinding", "Service"} <= kinds
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert by_name["Deployment", "ci-trtforge"]["spec"]["replicas"] == 2
    broker = by_name["Deployment", "ci-trtforge-broker"]
    assert broker["spec"]["replicas"] == 2
    assert broker["spec"]["template"]["spec"]["serviceAccountName"] == "ci-trtforge-broker"
    for kind in ("Service", "PodDisruptionBudget", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"):
        assert (kind, "ci-trtforge-broker") in by_name, kind
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    from trtforge_operator.config import OperatorConfig

    parsed = OperatorConfig.model_validate(cfg)  # the operator and the broker accept what the chart writes
    assert cfg["leader_election"]["lease_duration_seconds"] == 15
    assert parsed.broker.enabled is False  # the operator serves no engines; the broker Deployment does
    assert parsed.engine_source() == "http://ci-trtforge-broker.trtforge-system.svc:8081"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"operator": {"replicas": -1}}, "/operator/replicas"),
        ({"operatr": {}}, "operatr"),
        ({"operator": {"leaderElection": {"renewDeadlineSeconds": 20}}}, "leaseDurationSeconds (15)"),
        ({"operator": {"leaderElection": {"retryPeriodSeconds": 9}}}, "1.2 x retryPeriodSeconds"),
        ({"metrics": {"prometheusRule": {"enabled": "yes"}}}, "/metrics/prometheusRule/enabled"),
        ({"broker": {"replicas": 1}}, "/broker/replicas"),
        ({"broker": {"replicas": 3, "podDisruptionBudget": {"minAvailable": 3}}}, "minAvailable (3)"),
        ({"broker": {"antiAffinity": "required"}}, "antiAffinity"),
        ({"metrics": {"bindAddress": "10.0.0.7"}}, "/metrics/bindAddress"),
        ({"metrics": {"serviceMonitor": {"enabled": True}}}, "metrics.bindAddress is 127.0.0.1"),
        (
            {"autoscaling": {"keda": {"prometheusServerAddress": "prometheus:9090"}}},
            "prometheusServerAddress",
        ),
    ],
)
def test_helm_refuses_bad_values_naming_the_field(values: dict[str, Any], needle: str) -> None:
    _, r = render("bad", "trtforge-system", values, check=False)
    assert r.returncode != 0, f"{values} was rendered"
    assert needle in r.stderr, r.stderr


def test_metrics_listen_inside_the_pod_unless_opened() -> None:
    """The operator's /metrics names every tenant's objects and has no authentication: by default the
    config the chart writes makes it listen on 127.0.0.1; metrics.bindAddress 0.0.0.0 opens it."""
    from trtforge_operator.config import OperatorConfig

    def cfg(values: dict[str, Any] | None) -> OperatorConfig:
        docs, _ = render("m", "trtforge-system", values)
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
        return OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))

    assert cfg(None).metrics_address() == "127.0.0.1"
    opened = cfg({"metrics": {"bindAddress": "0.0.0.0", "serviceMonitor": {"enabled": True}}})
    assert opened.metrics_address() == "0.0.0.0"


def test_the_keda_prometheus_address_reaches_the_operator() -> None:
    """spec.autoscaling.provider KEDA needs the Prometheus its ScaledObjects' triggers query: the
    chart's autoscaling.keda.prometheusServerAddress, unset by default (KEDA is then refused in
    status), and the request rate's window is prometheus-adapter's."""
    from trtforge_operator.config import OperatorConfig

    def cfg(values: dict[str, Any] | None) -> OperatorConfig:
        docs, _ = render("k", "trtforge-system", values)
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
        return OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))

    assert cfg(None).autoscaling.keda_prometheus_address is None
    address = "http://prometheus-operated.monitoring.svc:9090"
    set_ = cfg(
        {
            "autoscaling": {"keda": {"prometheusServerAddress": address}},
            "metrics": {"prometheusAdapter": {"rateWindow": "2m"}},
        }
    )
    assert (set_.autoscaling.keda_prometheus_address, set_.autoscaling.rate_window) == (address, "2m")


def test_on_a_pvc_store_only_the_broker_mounts_the_claim_and_the_operator_goes_through_it() -> None:
    """A claim that cannot bind holds the broker only: the operator mounts no claim, reads and writes
    the store through the broker as its own ServiceAccount, which the broker's config names; on S3
    the operator reads the bucket itself."""
    from trtforge_operator.config import OperatorConfig

    def rendered(values: dict[str, Any] | None) -> tuple[OperatorConfig, dict[str, Any], dict[str, Any]]:
        docs, _ = render("k", "trtforge-system", values)
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
        deps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
        cfg = OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
        return (
            cfg,
            deps["k-trtforge"]["spec"]["template"]["spec"],
            deps["k-trtforge-broker"]["spec"]["template"]["spec"],
        )

    cfg, operator, broker = rendered(None)
    assert cfg.store_via_broker and cfg.store_uri.startswith("pvc://")
    assert cfg.broker.operator_service_account == operator["serviceAccountName"]
    assert not [v for v in operator["volumes"] if "persistentVolumeClaim" in v]
    claim = cfg.store_uri.removeprefix("pvc://").partition("/")[0]
    assert [
        v["persistentVolumeClaim"]["claimName"] for v in broker["volumes"] if "persistentVolumeClaim" in v
    ] == [claim]
    (token,) = [v for v in operator["volumes"] if v["name"] == "broker-token"]
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == cfg.broker.audience
    s3, operator, _ = rendered({"store": {"type": "s3", "s3": {"bucket": "engines", "existingSecret": "s"}}})
    assert not s3.store_via_broker and s3.store_uri.startswith("s3://")
    assert not [v for v in operator["volumes"] if v["name"] == "broker-token"]


def test_the_front_proxy_reaches_the_operator_with_its_configmap_rights() -> None:
    """runtime.frontProxy: off by default (no ConfigMap rights at all); on, its settings reach the
    operator and the ConfigMap role is bound wherever the watched role is."""
    from trtforge_operator.config import OperatorConfig

    def rendered(values: dict[str, Any] | None) -> tuple[OperatorConfig, list[dict[str, Any]]]:
        docs, _ = render("k", "trtforge-system", values)
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
        return OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"])), docs

    def bound(docs: list[dict[str, Any]], role: str) -> set[tuple[str, str]]:
        return {
            (d["kind"], d["metadata"].get("namespace", ""))
            for d in docs
            if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
            and d["roleRef"]["name"] == f"k-trtforge-{role}"
        }

    off, docs = rendered(None)
    assert not off.front_proxy.enabled
    assert not bound(docs, "operator-front-proxy")
    assert not any(d["metadata"]["name"] == "k-trtforge-operator-front-proxy" for d in docs)
    values = {
        "runtime": {
            "frontProxy": {"enabled": True, "image": "haproxy:2.6.12", "callsPerClientPerSecond": 50}
        },
        "operator": {"watchNamespaces": ["team-a"]},
    }
    on, docs = rendered(values)
    assert (on.front_proxy.enabled, on.front_proxy.image, on.front_proxy.calls_per_client_per_second) == (
        True,
        "haproxy:2.6.12",
        50,
    )
    assert bound(docs, "operator-front-proxy") == bound(docs, "operator-watched") != set()


def _pdbs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodDisruptionBudget"}


def test_more_replicas_are_allowed_and_get_a_pdb() -> None:
    docs, _ = render("ha", "trtforge-system", {"operator": {"replicas": 3}, "broker": {"replicas": 5}})
    pdbs = _pdbs(docs)
    assert pdbs["ha-trtforge"]["spec"]["minAvailable"] == 1
    assert pdbs["ha-trtforge-broker"]["spec"]["minAvailable"] == 1
    (broker,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "ha-trtforge-broker"
    ]
    assert broker["spec"]["replicas"] == 5
    docs, _ = render("one", "trtforge-system", {"operator": {"replicas": 1}})
    assert set(_pdbs(docs)) == {"one-trtforge-broker"}  # the broker always runs replicated


def test_pdb_api_follows_the_cluster() -> None:
    """policy/v1 where the cluster serves it (1.21+); policy/v1beta1 for older ones (the 1.20 test bed)."""
    for kube, want in [(None, "policy/v1"), ("v1.20.2", "policy/v1beta1"), ("v1.21.0", "policy/v1")]:
        docs, _ = render("p", "trtforge-system", None, kube_version=kube)
        assert {d["apiVersion"] for d in _pdbs(docs).values()} == {want}, kube
    # `helm install` against a 1.20 cluster that serves policy/v1 PodDisruptionBudget (what
    # .Capabilities.APIVersions.Has sees): policy/v1.
    r = helm(
        "template",
        "p",
        str(CHART),
        "--kube-version",
        "v1.20.2",
        "--api-versions",
        "policy/v1/PodDisruptionBudget",
    )
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert {d["apiVersion"] for d in _pdbs(docs).values()} == {"policy/v1"}


def test_lease_rbac_is_namespaced_to_the_release() -> None:
    docs, _ = render("r", "ops", None)
    roles = [d for d in docs if d["kind"] in ("Role", "ClusterRole")]
    lease_roles = [r for r in roles if any("coordination.k8s.io" in x["apiGroups"] for x in r["rules"])]
    assert [(r["kind"], r["metadata"]["namespace"]) for r in lease_roles] == [("Role", "ops")]


# ------------------------------------------------------------------------------------- alerts


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: `make deps` installs Debian's prometheus package"
    return path


def _rules(tmp: Path, values: dict[str, Any] | None = None) -> Path:
    docs, _ = render(
        "t", "trtforge-system", {"metrics": {"prometheusRule": {"enabled": True}}, **(values or {})}
    )
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    path = tmp / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def _exported() -> dict[str, set[frozenset[tuple[str, str]]]]:
    """Series (name -> label sets) that the operator's, the broker's and the runtime's metrics classes
    export."""
    from trtforge_operator.api import InferenceDeploymentStatus, TRTEngineStatus
    from trtforge_operator.metrics import BrokerMetrics
    from trtforge_operator.metrics import Metrics as OperatorMetrics
    from trtforge_runtime.serving.metrics import Metrics as RuntimeMetrics

    from trtforge.contract.build_result import BuildFailure

    m = OperatorMetrics(CollectorRegistry())
    m.leader.set(1)
    m.lease_transitions.set(2)
    stalled = TRTEngineStatus.model_validate(
        {
            "conditions": [
                {
                    "type": "Stalled",
                    "status": "True",
                    "reason": "BuildFailed",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    )
    m.observe_engine("team-a", "resnet", stalled)
    m.observe_deployment("team-a", "resnet", InferenceDeploymentStatus(replicas=2, ready_replicas=1))
    m.observe_build_result(BuildFailure(error="s3 down", reason="StoreUnavailable", exit_code=80).to_line())
    m.faults.labels("MovedRebuild").inc()
    broker = BrokerMetrics(CollectorRegistry())
    broker.broker_requests.labels("500").inc()
    broker.broker_requests.labels("200").inc()
    rt = RuntimeMetrics("resnet")
    rt.ready_m.set(0)
    out: dict[str, set[frozenset[tuple[str, str]]]] = {}
    for reg in (m.registry, broker.registry, rt.registry):
        text = generate_latest(reg).decode()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, set()).add(frozenset(s.labels.items()))
    return out


OP = {"job": "t-trtforge", "namespace": "trtforge-system"}
BROKER = {"job": "t-trtforge-broker", "namespace": "trtforge-system"}  # the broker Service's scrape


def _series(
    exported: dict[str, set[frozenset[tuple[str, str]]]], metric: str, target: dict[str, str], **labels: str
) -> str:
    """A promtool series of a name and labels the code really exports, plus the scrape's target labels."""
    assert metric in exported, f"{metric} is not exported by the operator or runtime"
    assert frozenset(labels.items()) in exported[metric], (
        f"{metric}{labels} is not how it is exported: {exported[metric]}"
    )
    all_labels = {**labels, **target}
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(all_labels.items())) + "}"


def test_alerts_with_promtool(tmp_path: Path) -> None:
    rules = _rules(tmp_path)
    check = subprocess.run([_promtool(), "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    ex = _exported()
    pod_a, pod_b = {**OP, "pod": "op-a"}, {**OP, "pod": "op-b"}
    broker_a, broker_b = {**BROKER, "pod": "broker-a"}, {**BROKER, "pod": "broker-b"}
    rt_target = {"namespace": "team-a", "pod": "resnet-h100-abc"}

    def s(metric: str, target: dict[str, str], values: str, **labels: str) -> dict[str, str]:
        return {"series": _series(ex, metric, target, **labels), "values": values}

    tests: list[dict[str, Any]] = [
        {  # the leader dies at 1m; its replica never takes over: no leader after 1m + 15 s
            "interval": "15s",
            "input_series": [
                s("trtforge_leader", pod_a, "1x3 0x20"),
                s("trtforge_leader", pod_b, "0x24"),
            ],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "TrtforgeNoLeader", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "TrtforgeNoLeader", "exp_alerts": [_no_leader()]},
            ],
        },
        {  # a takeover within the lease: never an alert
            "interval": "15s",
            "input_series": [
                s("trtforge_leader", pod_a, "1x3 stale"),
                s("trtforge_leader", pod_b, "0x3 1x20"),
            ],
            "alert_rule_test": [
                {"eval_time": t, "alertname": "TrtforgeNoLeader", "exp_alerts": []}
                for t in ("1m", "2m", "5m")
            ],
        },
        {  # every replica gone: no series at all still alerts
            "interval": "15s",
            "input_series": [s("trtforge_leader", pod_a, "1x3 stale")],
            "alert_rule_test": [
                {"eval_time": "3m", "alertname": "TrtforgeNoLeader", "exp_alerts": [_no_leader()]}
            ],
        },
        {
            "interval": "1m",
            "input_series": [
                s("trtforge_leader", pod_a, "1x60"),
                s(
                    "trtforge_engine_stalled",
                    OP | {"pod": "op-a"},
                    "0x4 1x30",
                    tenant_namespace="team-a",
                    name="resnet",
                ),
                s("trtforge_build_failures_total", pod_a, "0+1x10", reason="StoreUnavailable"),
                s("trtforge_gpu_faults_total", pod_a, "0+1x30", action="MovedRebuild"),
                s("trtforge_broker_requests_total", broker_a, "0+10x30", code="200"),
                s("trtforge_broker_requests_total", broker_b, "0+0x10 0+5x20", code="500"),
                s(
                    "trtforge_inferencedeployment_replicas",
                    pod_a,
                    "2x30",
                    tenant_namespace="team-a",
                    name="resnet",
                ),
                s(
                    "trtforge_inferencedeployment_ready_replicas",
                    pod_a,
                    "2x5 1x25",
                    tenant_namespace="team-a",
                    name="resnet",
                ),
                s("trtforge_runtime_ready", rt_target, "1x5 0x25", model="resnet"),
            ],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": "TrtforgeEngineStalled", "exp_alerts": []},
                {
                    "eval_time": "10m",
                    "alertname": "TrtforgeEngineStalled",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                "tenant_namespace": "team-a",
                                "name": "resnet",
                            },
                            "exp_annotations": {
                                "summary": "TRTEngine team-a/resnet is Stalled",
                                "description": (
                                    "A target gave up after its build "
                                    "attempts. kubectl describe trtengine -n team-a "
                                    "resnet names the reason; fix it and bump the spec."
                                ),
                            },
                        }
                    ],
                },
                {
                    "eval_time": "10m",
                    "alertname": "TrtforgeBuildFailures",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning", "reason": "StoreUnavailable"},
                            "exp_annotations": {
                                "summary": "Builds fail with StoreUnavailable",
                                "description": (
                                    "10 build Jobs failed with reason StoreUnavailable in the last hour "
                                    "(StoreUnavailable: the store; ModelFetchFailed: model URIs or secrets; "
                                    "BuildFailed/ValidationFailed: the models or the builder image)."
                                ),
                            },
                        }
                    ],
                },
                {"eval_time": "3m", "alertname": "TrtforgeGPUFaultRate", "exp_alerts": []},
                {
                    "eval_time": "10m",
                    "alertname": "TrtforgeGPUFaultRate",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning"},
                            "exp_annotations": {
                                "summary": "GPU faults are frequent",
                                "description": (
                                    "10 GPU faults were handled in the last "
                                    "hour. Look for a failing node (kubectl "
                                    "get events --field-selector reason=GPUFault -A) and drain it."
                                ),
                            },
                        }
                    ],
                },
                {"eval_time": "10m", "alertname": "TrtforgeBrokerErrors", "exp_alerts": []},
                {
                    "eval_time": "20m",
                    "alertname": "TrtforgeBrokerErrors",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "critical"},
                            "exp_annotations": {
                                "summary": "The engine broker fails requests",
                                "description": (
                                    "33.33% of engine broker requests "
                                    "fail (5xx): new runtime pods cannot fetch "
                                    "engines. Check the store and the broker's logs."
                                ),
                            },
                        }
                    ],
                },
                {"eval_time": "10m", "alertname": "TrtforgeRuntimeNotReady", "exp_alerts": []},
                {
                    "eval_time": "20m",
                    "alertname": "TrtforgeRuntimeNotReady",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                "tenant_namespace": "team-a",
                                "name": "resnet",
                            },
                            "exp_annotations": {
                                "summary": "InferenceDeployment team-a/resnet lacks ready pods",
                                "description": (
                                    "1 runtime pods are not Ready. kubectl "
                                    "describe inferencedeployment -n team-a "
                                    "resnet, then the pods' termination messages."
                                ),
                            },
                        }
                    ],
                },
                {
                    "eval_time": "20m",
                    "alertname": "TrtforgeRuntimeModelNotReady",
                    "exp_alerts": [
                        {
                            "exp_labels": {
                                "severity": "warning",
                                "namespace": "team-a",
                                "pod": "resnet-h100-abc",
                                "model": "resnet",
                            },
                            "exp_annotations": {
                                "summary": "Runtime pod team-a/resnet-h100-abc does not serve",
                                "description": (
                                    "Model resnet is loaded but not ready "
                                    "(canary failed or stopped). Its log and "
                                    "termination message say why."
                                ),
                            },
                        }
                    ],
                },
                {"eval_time": "20m", "alertname": "TrtforgeNoLeader", "exp_alerts": []},
            ],
        },
    ]
    spec = {"rule_files": [str(rules)], "evaluation_interval": "15s", "tests": tests}
    test_file = tmp_path / "alerts_test.yaml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False, width=1000))
    r = subprocess.run([_promtool(), "test", "rules", str(test_file)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _no_leader() -> dict[str, Any]:
    return {
        "exp_labels": {"severity": "critical"},
        "exp_annotations": {
            "summary": "No trtforge operator replica leads",
            "description": (
                "No replica of trtforge-system/t-trtforge has held the leader Lease for 15s. "
                "Check the operator pods (kubectl -n trtforge-system get pods,lease) and their "
                "logs."
            ),
        },
    }


def test_promtool_catches_a_broken_rule(tmp_path: Path) -> None:
    """The harness can fail: a test expecting an alert that does not fire fails."""
    rules = _rules(tmp_path)
    spec = {
        "rule_files": [str(rules)],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {
                        "series": 'trtforge_leader{job="t-trtforge",namespace="trtforge-system",pod="a"}',
                        "values": "1x20",
                    }
                ],
                "alert_rule_test": [
                    {"eval_time": "2m", "alertname": "TrtforgeNoLeader", "exp_alerts": [_no_leader()]}
                ],
            }
        ],
    }
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump(spec))
    r = subprocess.run([_promtool(), "test", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode != 0


def test_default_install_names_the_operators_default_images_store_and_tolerations() -> None:
    """`helm install trtforge charts/trtforge -n trtforge-system` configures the operator with exactly
    its own defaults (trtforge/contract/images.py): the same images, store claim and tolerations."""
    from trtforge_operator.config import OperatorConfig

    docs, _ = render("trtforge", "trtforge-system")
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "trtforge-config"]
    chart = OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    default = OperatorConfig()
    assert (chart.builder_image, chart.runtime_image, chart.runtime_image_full) == (
        default.builder_image,
        default.runtime_image,
        default.runtime_image_full,
    )
    assert chart.store_uri.rstrip("/") == default.store_uri.rstrip("/") == "pvc://trtforge-engines"
    assert chart.tolerations == default.tolerations and chart.image_pull_secrets == []
    pushed, _ = render(
        "trtforge",
        "trtforge-system",
        {"global": {"imageRegistry": "registry.example.com/team", "imagePullSecrets": [{"name": "regcred"}]}},
    )
    (cm,) = [d for d in pushed if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "trtforge-config"]
    cfg = OperatorConfig.model_validate(yaml.safe_load(cm["data"]["config.yaml"]))
    assert cfg.runtime_image_full == "registry.example.com/team/trtforge-runtime:0.1.0-full"
    assert cfg.image_pull_secrets == ["regcred"]
    images = {
        c["image"]
        for d in pushed
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example.com/team/trtforge-operator:0.1.0"}
