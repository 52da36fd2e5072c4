"""deploy/argocd/application.yaml as Argo CD syncs it: the chart rendered by the real Helm (4.1.4,
trtforge_dev.testbed.helm) with the Application's release name, namespace and `valuesObject`, and the
rendered manifests applied to the test bed (Argo CD itself is not installed here: its sync is this
render and a server-side apply).

Test-bed adaptations: the CRDs come from localdev.install_crds (the 1.20 apiserver refuses their CEL
rules through server-side apply; install.md says so), ServiceMonitors are left out where the
apiserver has no Prometheus Operator CRDs (trtforge_dev/testbed/chart.py), and the Deployments are
applied with 0 replicas: whether the operator runs from the chart is test_ha.py's question.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from trtforge_dev import localdev
from trtforge_dev.testbed.chart import apply, delete, helm, kube_version, render

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
APPLICATION = REPO / "deploy" / "argocd" / "application.yaml"


def chart_application() -> dict[str, Any]:
    apps = [d for d in yaml.safe_load_all(APPLICATION.read_text()) if d]
    (app,) = [a for a in apps if a["spec"]["source"].get("path") == "charts/trtforge"]
    return dict(app)


def test_the_application_renders_with_the_real_helm() -> None:
    app = chart_application()
    src, dest = app["spec"]["source"], app["spec"]["destination"]
    docs, _ = render(src["helm"]["releaseName"], dest["namespace"], src["helm"]["valuesObject"])
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ConfigMap", "ServiceMonitor", "ClusterRole"} <= kinds
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "trtforge-config"]
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    registry = src["helm"]["valuesObject"]["global"]["imageRegistry"]
    assert cfg["builder_image"].startswith(f"{registry}/trtforge-builder:")
    # Argo CD renders with --include-crds.
    crds = helm("template", "trtforge", str(REPO / "charts" / "trtforge"), "--include-crds").stdout
    assert "kind: CustomResourceDefinition" in crds


def test_the_applications_manifests_sync_on_the_test_bed(testbed: Any) -> None:
    app = chart_application()
    src, dest = app["spec"]["source"], app["spec"]["destination"]
    ns = dest["namespace"]
    values = src["helm"]["valuesObject"]
    docs, _ = render(src["helm"]["releaseName"], ns, values, kube_version=kube_version(testbed))
    for d in docs:
        if d["kind"] == "Deployment":
            d["spec"]["replicas"] = 0
    localdev.install_crds(testbed)
    labels = app["spec"]["syncPolicy"]["managedNamespaceMetadata"]["labels"]
    testbed.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
        ),
    )
    testbed.kubectl(  # created out of band, as the Application's comment says
        "-n",
        ns,
        "create",
        "secret",
        "generic",
        values["store"]["s3"]["existingSecret"],
        "--from-literal=AWS_ACCESS_KEY_ID=x",
        "--from-literal=AWS_SECRET_ACCESS_KEY=y",
    )
    try:
        skipped = apply(testbed, docs)
        assert {k for _, k in skipped} <= {"ServiceMonitor", "PrometheusRule", "PodDisruptionBudget"}
        for d in docs:
            if (d["apiVersion"], d["kind"]) in skipped:
                continue
            where = ["-n", d["metadata"]["namespace"]] if d["metadata"].get("namespace") else []
            got = testbed.kubectl("get", d["kind"].lower(), d["metadata"]["name"], *where, "-o", "name")
            assert got.stdout.strip(), d["kind"]
    finally:
        delete(testbed, docs)
        # Gone before another module (the quick start's) makes the namespace again.
        testbed.kubectl("delete", "namespace", ns, "--timeout=180s", check=False, timeout=240)
