"""The operator under the chart's ServiceAccount and RBAC — not as admin — does the example lifecycle.

Platform setup is done as admin, as a platform team installing the chart would: the chart's RBAC
(the templates verbatim, names substituted), its ServiceAccount, the build namespace's builder
ServiceAccount and store claims (trtforge_dev.localdev, the test bed's stand-in for the chart's
PVC). Then `trtforge operator` runs with a kubeconfig holding only that ServiceAccount's token, and
a tenant's TRTEngine and InferenceDeployment must become Ready and be deleted cleanly, with no
authorization error in the operator's log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from trtforge_dev import localdev
from trtforge_dev.testbed.handle import TestBed
from trtforge_dev.testbed.wait import wait_for

from tests.integration.chart_release import chart_broker, chart_release, sa_kubeconfig, sa_token

pytestmark = [pytest.mark.integration, pytest.mark.slow]
__all__ = ["chart_release"]  # the fixture
H100 = "NVIDIA-H100-80GB-HBM3"


def test_operator_lifecycle_as_the_charts_service_account(
    testbed: TestBed, chart_release: dict[str, str], tmp_path: Path
) -> None:
    sysns, tenant, fullname = chart_release["namespace"], chart_release["tenant"], chart_release["fullname"]
    with testbed.api_client() as api:
        store_dir, models_dir = localdev.prepare_build_namespace(api, sysns)
        sha = localdev.tiny_model(models_dir / "tiny.onnx")
        pv = localdev.tenant_models_claim(api, tenant, models_dir)  # the tenant's own model claim
        token = sa_token(api, sysns, fullname)
        sa_token(api, tenant, "default")  # runtime pods present a token of their namespace's default SA
    kubeconfig = sa_kubeconfig(testbed, token, tmp_path / "operator.kubeconfig")
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
        broker={"enabled": False},  # as the chart: the broker runs apart, under its own account
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
    broker = chart_broker(testbed, chart_release, config, tmp_path)
    with broker, op, testbed.api_client() as api:
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
            raise AssertionError(
                f"{e}\n--- operator log ---\n{op.tail(80)}\n--- broker log ---\n{broker.tail(30)}"
            ) from e
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
        log = op.tail(100000) + broker.tail(100000)
    testbed.kubectl("delete", "pv", pv, "--wait=false", "--ignore-not-found", check=False)
    for bad in ("Forbidden", "forbidden", "Not enough permissions"):
        assert bad not in log, f"the operator or broker met an authorization error ({bad}):\n{log[-4000:]}"
