"""The chart's RBAC on the test bed, as a platform team installing the chart would set it up: the
RBAC objects and ServiceAccounts of the chart as Helm renders them, and a kubeconfig holding only the
operator's token. Shared by the tests that run the operator under the chart's RBAC."""

from __future__ import annotations

import base64
import secrets
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev import localdev
from trtforge_dev.testbed.chart import render
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.wait import wait_for

REPO = Path(__file__).resolve().parents[2]
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def chart_rbac(fullname: str, namespace: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's ServiceAccounts and RBAC objects, as `helm template <fullname> -n <namespace>`
    renders them with `values` (a release name holding the chart's name is its full name)."""
    docs, _ = render(fullname, namespace, values)
    return [d for d in docs if d["kind"] in RBAC_KINDS]


def apply_chart_rbac(
    testbed: TestBed, fullname: str, namespace: str, values: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Apply :func:`chart_rbac` (the namespaces it names must exist); returns what was applied."""
    docs = chart_rbac(fullname, namespace, values)
    testbed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    return docs


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
    """The chart's RBAC and ServiceAccounts for an operator watching `tenants` tenant namespaces (keys
    tenant, tenant2, ...; `operator.watchNamespaces`, as the operator config these tests write), in a
    fresh release namespace."""
    tag = secrets.token_hex(3)
    rel = {"fullname": f"trtforge-{tag}", "namespace": f"trtforge-op-{tag}", "tenant": f"tenant-{tag}"}
    for i in range(2, tenants + 1):
        rel[f"tenant{i}"] = f"tenant{i}-{tag}"
    localdev.install_crds(testbed)
    with testbed.api_client() as api:
        for ns in (rel["namespace"], *tenant_namespaces(rel)):
            localdev.ensure_namespace(api, ns)
    apply_chart_rbac(
        testbed,
        rel["fullname"],
        rel["namespace"],
        {
            "operator": {"watchNamespaces": tenant_namespaces(rel)},
            # The store's claim as these tests make it (localdev): the operator may read that one.
            "store": {"pvc": {"claimName": localdev.STORE_CLAIM}},
        },
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


class ChartOperatorBed:
    """What a test world with the operator and the broker under the chart's ServiceAccounts needs
    from them: `tb`, `api`, `op` (the operator process) and `broker_process` are set by the
    subclass."""

    tb: TestBed
    api: client.ApiClient
    op: localdev.OperatorProcess
    broker_process: Any

    def apply(self, *objs: dict[str, Any], check: bool = True) -> Any:
        return self.tb.kubectl(
            "apply", "--validate=false", "-f", "-", input=yaml.safe_dump_all(objs), check=check
        )

    def get(self, plural: str, ns: str, name: str) -> dict[str, Any]:
        return localdev.get_custom(self.api, plural, ns, name)

    def wait(self, what: str, fn: Any, timeout: float = 240) -> Any:
        """`fn`'s first truthy answer, while the operator lives; the operator's and the broker's
        logs in the failure when none comes within `timeout`."""

        def check() -> Any:
            assert self.op.alive(), self.op.tail()
            return fn()

        try:
            return wait_for(check, timeout=timeout, desc=what)
        except TimeoutError as e:
            raise AssertionError(
                f"{e}\n--- operator log ---\n{self.op.tail(60)}"
                f"\n--- broker log ---\n{self.broker_process.tail(30)}"
            ) from e


def tenant_namespaces(rel: dict[str, str]) -> list[str]:
    return [v for k, v in sorted(rel.items()) if k.startswith("tenant")]


def delete_chart_cluster_rbac(testbed: TestBed, fullname: str) -> None:
    """Delete the cluster-scoped RBAC objects a release of the chart named `fullname` made."""
    for kind, suffix in (
        ("clusterrole", "operator"),
        ("clusterrolebinding", "operator"),
        ("clusterrole", "view"),
        ("clusterrole", "edit"),
        ("clusterrole", "operator-watched"),
        ("clusterrolebinding", "operator-watched"),
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
