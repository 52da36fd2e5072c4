"""The chart's RBAC on the test bed, as a platform team installing the chart would set it up: the
templates verbatim (names substituted), the operator's ServiceAccount and a kubeconfig holding only
its token. Shared by the tests that run the operator under the chart's RBAC."""

from __future__ import annotations

import base64
import importlib.util
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev import localdev
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "charts" / "trtforge" / "templates"
STATIC_RBAC = [
    "rbac-operator.yaml",
    "rbac-build.yaml",
    "rbac-tenant.yaml",
    "rbac-model-secrets.yaml",
    "rbac-leader-election.yaml",
    "rbac-broker.yaml",
]


def _substitute(text: str, fullname: str, namespace: str) -> str:
    spec = importlib.util.spec_from_file_location(
        "test_chart_helpers", REPO / "tests/unit/test_chart_helpers.py"
    )
    assert spec and spec.loader
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    names = {
        '{{ include "trtforge.fullname" . }}': fullname,
        '{{ include "trtforge.serviceAccountName" . }}': fullname,
        '{{ include "trtforge.buildNamespace" . }}': namespace,
        "{{ .Release.Namespace }}": namespace,
        "{{ .Values.operator.leaderElection.leaseName | quote }}": '"trtforge-operator"',
        '{{- include "trtforge.labels" . | nindent 4 }}': f"app.kubernetes.io/instance: {fullname}",
        '{{ include "trtforge.brokerName" . }}': f"{fullname}-broker",
        '{{- include "trtforge.brokerLabels" . | nindent 4 }}': f"app.kubernetes.io/instance: {fullname}",
    }
    out: str = helpers.substitute_static(text, names)
    return out


def sa_token(api: client.ApiClient, ns: str, name: str) -> str:
    core: Any = client.CoreV1Api(api)

    def token() -> str | None:
        sa = core.read_namespaced_service_account(name, ns)
        for ref in sa.secrets or []:
            sec = core.read_namespaced_secret(ref.name, ns)
            if sec.type == "kubernetes.io/service-account-token" and (sec.data or {}).get("token"):
                return base64.b64decode(sec.data["token"]).decode()
        return None

    return str(wait_for(token, timeout=60, desc=f"a token for ServiceAccount {ns}/{name}"))


def sa_kubeconfig(tb: TestBed, token: str, path: Path) -> Path:
    admin = yaml.safe_load(tb.kubeconfig.read_text())
    cluster = admin["clusters"][0]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "trtforge-operator", "user": {"token": token}}],
                "contexts": [
                    {"name": "operator", "context": {"cluster": cluster["name"], "user": "trtforge-operator"}}
                ],
                "current-context": "operator",
            }
        )
    )
    return path


def install_chart_rbac(testbed: TestBed, tenants: int = 1) -> dict[str, str]:
    """The chart's RBAC (templates verbatim, names substituted) and ServiceAccount, a release
    namespace and `tenants` tenant namespaces (keys tenant, tenant2, ...)."""
    tag = secrets.token_hex(3)
    rel = {"fullname": f"trtforge-{tag}", "namespace": f"trtforge-op-{tag}", "tenant": f"tenant-{tag}"}
    for i in range(2, tenants + 1):
        rel[f"tenant{i}"] = f"tenant{i}-{tag}"
    localdev.install_crds(testbed)
    with testbed.api_client() as api:
        for ns in (rel["namespace"], *tenant_namespaces(rel)):
            localdev.ensure_namespace(api, ns)
    for name in STATIC_RBAC:
        text = _substitute((TEMPLATES / name).read_text(), rel["fullname"], rel["namespace"])
        testbed.kubectl("apply", "-f", "-", input=text)
    testbed.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": rel["fullname"], "namespace": rel["namespace"]},
            }
        ),
    )
    return rel


def chart_broker(
    testbed: TestBed, rel: dict[str, str], config: Path, workdir: Path
) -> localdev.OperatorProcess:
    """`trtforge broker` as the chart runs it: apart from the operator, under the broker's own
    ServiceAccount and RBAC, on the operator config's broker port. The config must say
    `broker.enabled: false` (the operator runs no broker of its own), as the chart's does."""
    cfg = yaml.safe_load(config.read_text())
    assert cfg["broker"].get("enabled") is False, "the chart's operator runs no broker of its own"
    with testbed.api_client() as api:
        token = sa_token(api, rel["namespace"], f"{rel['fullname']}-broker")
    kubeconfig = sa_kubeconfig(testbed, token, workdir / "broker.kubeconfig")
    port = str(cfg["broker"]["port"])
    return localdev.OperatorProcess(
        config, kubeconfig, workdir / "broker.log", command=("broker", "--port", port)
    )


def tenant_namespaces(rel: dict[str, str]) -> list[str]:
    return [v for k, v in sorted(rel.items()) if k.startswith("tenant")]


def delete_chart_cluster_rbac(testbed: TestBed, fullname: str) -> None:
    """Delete the cluster-scoped RBAC objects a release of the chart named `fullname` made."""
    for kind, suffix in (
        ("clusterrole", "operator"),
        ("clusterrolebinding", "operator"),
        ("clusterrole", "view"),
        ("clusterrole", "edit"),
        ("clusterrole", "model-secrets"),
        ("clusterrole", "broker"),
        ("clusterrolebinding", "broker"),
    ):
        testbed.kubectl(
            "delete", kind, f"{fullname}-{suffix}", "--ignore-not-found", "--wait=false", check=False
        )


def uninstall_chart_rbac(testbed: TestBed, rel: dict[str, str], pvs: Sequence[str] = ()) -> None:
    delete_chart_cluster_rbac(testbed, rel["fullname"])
    for ns in (rel["namespace"], *tenant_namespaces(rel)):
        testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    for pv in pvs:
        testbed.kubectl("delete", "pv", pv, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def chart_release(testbed: TestBed) -> Iterator[dict[str, str]]:
    rel = install_chart_rbac(testbed)
    try:
        yield rel
    finally:
        uninstall_chart_rbac(testbed, rel)
