"""The operator under the chart's ServiceAccount and RBAC — not as admin — does the example lifecycle.

Platform setup is done as admin, as a platform team installing the chart would: the chart's RBAC
(the templates verbatim, names substituted), its ServiceAccount, the build namespace's builder
ServiceAccount and store claims (trtforge_dev.localdev, the test bed's stand-in for the chart's
PVC). Then `trtforge operator` runs with a kubeconfig holding only that ServiceAccount's token, and
a tenant's TRTEngine and InferenceDeployment must become Ready and be deleted cleanly, with no
authorization error in the operator's log.
"""

from __future__ import annotations

import base64
import importlib.util
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev import localdev
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "charts" / "trtforge" / "templates"
STATIC_RBAC = [
    "rbac-operator.yaml",
    "rbac-build.yaml",
    "rbac-tenant.yaml",
    "rbac-model-secrets.yaml",
    "rbac-leader-election.yaml",
]
H100 = "NVIDIA-H100-80GB-HBM3"


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
    }
    out: str = helpers.substitute_static(text, names)
    return out


def _sa_token(api: client.ApiClient, ns: str, name: str) -> str:
    core: Any = client.CoreV1Api(api)

    def token() -> str | None:
        sa = core.read_namespaced_service_account(name, ns)
        for ref in sa.secrets or []:
            sec = core.read_namespaced_secret(ref.name, ns)
            if sec.type == "kubernetes.io/service-account-token" and (sec.data or {}).get("token"):
                return base64.b64decode(sec.data["token"]).decode()
        return None

    return str(wait_for(token, timeout=60, desc=f"a token for ServiceAccount {ns}/{name}"))


def _sa_kubeconfig(tb: TestBed, token: str, path: Path) -> Path:
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


@pytest.fixture
def chart_release(testbed: TestBed) -> Iterator[dict[str, str]]:
    tag = secrets.token_hex(3)
    rel = {"fullname": f"trtforge-{tag}", "namespace": f"trtforge-op-{tag}", "tenant": f"tenant-{tag}"}
    localdev.install_crds(testbed)
    with testbed.api_client() as api:
        for ns in (rel["namespace"], rel["tenant"]):
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
    try:
        yield rel
    finally:
        for kind, suffix in (
            ("clusterrole", "operator"),
            ("clusterrolebinding", "operator"),
            ("clusterrole", "view"),
            ("clusterrole", "edit"),
            ("clusterrole", "model-secrets"),
        ):
            testbed.kubectl(
                "delete",
                kind,
                f"{rel['fullname']}-{suffix}",
                "--ignore-not-found",
                "--wait=false",
                check=False,
            )
        for ns in (rel["namespace"], rel["tenant"]):
            testbed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_operator_lifecycle_as_the_charts_service_account(
    testbed: TestBed, chart_release: dict[str, str], tmp_path: Path
) -> None:
    sysns, tenant, fullname = chart_release["namespace"], chart_release["tenant"], chart_release["fullname"]
    with testbed.api_client() as api:
        store_dir, models_dir = localdev.prepare_build_namespace(api, sysns)
        sha = localdev.tiny_model(models_dir / "tiny.onnx")
        token = _sa_token(api, sysns, fullname)
        _sa_token(api, tenant, "default")  # runtime pods present a token of their namespace's default SA
    kubeconfig = _sa_kubeconfig(testbed, token, tmp_path / "operator.kubeconfig")
    # The identity really is the ServiceAccount, with nothing beyond the chart's RBAC.
    who = testbed.kubectl(
        f"--kubeconfig={kubeconfig}", "auth", "can-i", "create", "clusterroles", check=False
    )
    assert who.stdout.strip() == "no"
    config = tmp_path / "operator.yaml"
    localdev.write_config(
        config,
        build_ns=sysns,
        namespaces=[tenant],
        store_dir=store_dir,
        build_service_account="trtforge-builder",
    )
    engine = {
        "apiVersion": "trtforge.io/v1alpha1",
        "kind": "TRTEngine",
        "metadata": {"name": "tiny", "namespace": tenant},
        "spec": {
            "model": {"uri": "pvc://models/tiny.onnx", "sha256": sha},
            "precision": "fp32",
            "targets": [{"gpu": H100}],
        },
    }
    infd = {
        "apiVersion": "trtforge.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": "tiny", "namespace": tenant},
        "spec": {"engineRef": {"name": "tiny"}, "replicas": 1},
    }
    op = localdev.OperatorProcess(config, kubeconfig, tmp_path / "operator.log")
    with op, testbed.api_client() as api:
        testbed.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump_all([engine, infd]))

        def ready(plural: str) -> bool:
            assert op.alive(), op.tail()
            return bool(localdev.is_true(localdev.get_custom(api, plural, tenant, "tiny"), "Ready"))

        try:
            wait_for(lambda: ready("trtengines"), timeout=240, desc="TRTEngine Ready under the chart's RBAC")
            wait_for(
                lambda: ready("inferencedeployments"),
                timeout=240,
                desc="InferenceDeployment Ready under the chart's RBAC",
            )
        except TimeoutError as e:
            raise AssertionError(f"{e}\n--- operator log ---\n{op.tail(80)}") from e
        for plural in ("inferencedeployments", "trtengines"):
            localdev.delete_with_cleanup(api, tenant, plural, "tiny")
        co: Any = client.CustomObjectsApi(api)

        def gone() -> bool:
            for plural in ("inferencedeployments", "trtengines"):
                items = co.list_namespaced_custom_object("trtforge.io", "v1alpha1", tenant, plural)["items"]
                if items:
                    return False
            return True

        wait_for(gone, timeout=120, desc="both resources deleted (finalizers removed by the operator)")
        log = op.tail(100000)
    for bad in ("Forbidden", "forbidden", "Not enough permissions"):
        assert bad not in log, f"the operator met an authorization error ({bad}):\n{log[-4000:]}"
