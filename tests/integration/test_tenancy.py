"""Tenants cannot reach each other (issue 12), on the test bed, with the operator under the chart's
ServiceAccount and RBAC.

Three tenant namespaces in one cache group (so their engine keys coincide, as in one shared cache):
B holds a model and builds its engine; A holds the same model in its own claim; C only knows B's
model hash. A pays one verify step and gets B's engine as a cache hit; C's copycat never becomes
Ready and the broker answers C's token with 403; paths into the store are refused with a clear
reason and leave the store untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from trtforge_dev import localdev
from trtforge_dev.testbed.handle import TestBed
from trtforge_operator.config import CACHE_GROUP_LABEL

from tests.integration.chart_release import (
    ChartOperatorBed,
    chart_broker,
    install_chart_rbac,
    sa_kubeconfig,
    sa_token,
    tenant_namespaces,
    uninstall_chart_rbac,
)
from trtforge.contract.possession import GRANTS

pytestmark = [pytest.mark.integration, pytest.mark.slow]
H100 = "NVIDIA-H100-80GB-HBM3"
TARGETS = [{"gpu": H100}]


class Tenancy(ChartOperatorBed):
    def __init__(self, tb: TestBed, rel: dict[str, str], tmp: Path) -> None:
        self.tb, self.rel, self.tmp = tb, rel, tmp
        self.sysns = rel["namespace"]
        self.a, self.b, self.c = rel["tenant"], rel["tenant2"], rel["tenant3"]
        self.api = tb.api_client()
        self.pvs: list[str] = []
        self.store_dir, _ = localdev.prepare_build_namespace(self.api, self.sysns)
        self.claims: dict[str, Path] = {}
        for ns in (self.a, self.b, self.c):
            localdev.label_namespace(self.api, ns, {CACHE_GROUP_LABEL: f"g-{rel['fullname']}"})
            d = tmp / f"models-{ns}"  # each tenant its own model volume
            d.mkdir()
            self.claims[ns] = d
            self.pvs.append(localdev.tenant_models_claim(self.api, ns, d))
            sa_token(self.api, ns, "default")
        self.sha = localdev.tiny_model(self.claims[self.b] / "tiny.onnx", seed=3)
        assert localdev.tiny_model(self.claims[self.a] / "tiny.onnx", seed=3) == self.sha
        token = sa_token(self.api, self.sysns, rel["fullname"])
        self.config = tmp / "operator.yaml"
        self.cfg = localdev.write_config(
            self.config,
            build_ns=self.sysns,
            namespaces=tenant_namespaces(rel),
            store_dir=self.store_dir,
            build_service_account="trtforge-builder",
            broker={"enabled": False},  # as the chart: the broker runs apart, under its own account
        )
        kubeconfig = sa_kubeconfig(tb, token, tmp / "operator.kubeconfig")
        self.op = localdev.OperatorProcess(self.config, kubeconfig, tmp / "operator.log")
        self.broker_process = chart_broker(tb, rel, self.config, tmp)

    def ready(self, plural: str, ns: str, name: str) -> dict[str, Any]:
        def ok() -> dict[str, Any] | None:
            obj = self.get(plural, ns, name)
            return obj if localdev.is_true(obj, "Ready") else None

        found: dict[str, Any] = self.wait(f"{plural} {ns}/{name} Ready", ok)
        return found

    def jobs(self, ns: str, component: str) -> list[Any]:
        batch: Any = client.BatchV1Api(self.api)
        sel = f"app.kubernetes.io/component={component}"
        return list(batch.list_namespaced_job(ns, label_selector=sel).items)

    def broker(self, ns: str, method: str, path: str, data: bytes | None = None, **headers: str) -> int:
        core: Any = client.CoreV1Api(self.api)
        tok = core.create_namespaced_service_account_token(
            "default", ns, {"spec": {"audiences": ["trtforge-broker"], "expirationSeconds": 600}}
        )
        req = urllib.request.Request(f"{self.cfg['broker']['url']}{path}", data=data, method=method)
        req.add_header("Authorization", f"Bearer {tok.status.token}")
        for k, v in headers.items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def store_snapshot(self) -> dict[str, tuple[int, int]]:
        """Every file of the store but the operator's records of the verify Jobs it creates
        (verify-grants/: its own bookkeeping, written for any verify Job, refused or not)."""
        out = {}
        for dirpath, _, files in os.walk(self.store_dir):
            for f in files:
                p = Path(dirpath) / f
                rel = str(p.relative_to(self.store_dir))
                if rel.startswith(f"{GRANTS}/"):
                    continue
                st = p.stat()
                out[rel] = (st.st_size, st.st_mtime_ns)
        return out


def engine(name: str, uri: str, sha: str | None) -> dict[str, Any]:
    return localdev.engine_manifest(name, sha, TARGETS, model=uri)


@pytest.fixture(scope="module")
def t(testbed: TestBed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenancy]:
    rel = install_chart_rbac(testbed, tenants=3)
    env = None
    try:
        env = Tenancy(testbed, rel, tmp_path_factory.mktemp("tenancy"))
        env.broker_process.start()
        env.op.start()
        yield env
    finally:
        if env is not None:
            for ns in (env.a, env.b, env.c):
                for plural in ("inferencedeployments", "trtengines"):
                    testbed.kubectl("delete", plural, "--all", "-n", ns, "--wait=false", check=False)
            env.op.stop()
            env.broker_process.stop()
            env.api.close()
        uninstall_chart_rbac(testbed, rel, env.pvs if env else [])


def test_the_same_model_held_by_two_tenants_builds_once_the_second_pays_a_verify(t: Tenancy) -> None:
    uri = "pvc://models/tiny.onnx"
    t.apply(
        {**engine("tiny", uri, t.sha), "metadata": {"name": "tiny", "namespace": t.b}},
        {**localdev.deployment_manifest("tiny", "tiny"), "metadata": {"name": "tiny", "namespace": t.b}},
    )
    eb = t.ready("trtengines", t.b, "tiny")
    (tb_,) = eb["status"]["targets"]
    assert tb_["cacheHit"] is False and eb["status"]["model"]["sha256"] == t.sha
    builds = {j.metadata.name for j in t.jobs(t.sysns, "builder")}
    assert len(builds) == 1
    t.ready("inferencedeployments", t.b, "tiny")

    t.apply(
        {**engine("mine", uri, t.sha), "metadata": {"name": "mine", "namespace": t.a}},
        {**localdev.deployment_manifest("mine", "mine"), "metadata": {"name": "mine", "namespace": t.a}},
    )
    ea = t.ready("trtengines", t.a, "mine")
    (ta,) = ea["status"]["targets"]
    assert ta["cacheHit"] is True and ta["engineKey"] == tb_["engineKey"]
    assert {j.metadata.name for j in t.jobs(t.sysns, "builder")} == builds, "no second build"
    (verify,) = t.jobs(t.a, "verifier")
    assert verify.status.succeeded == 1
    verify_s = (verify.status.completion_time - verify.status.start_time).total_seconds()
    (build,) = t.jobs(t.sysns, "builder")
    build_s = (build.status.completion_time - build.status.start_time).total_seconds()
    print(f"\nsecond tenant: verify Job {verify_s:.1f}s instead of a build Job ({build_s:.1f}s)")
    # A's runtime pod fetches B's engine through the broker, with A's own proof.
    t.ready("inferencedeployments", t.a, "mine")
    assert t.broker(t.a, "GET", f"/engines/{ta['engineKey']}/manifest.json") == 200


def test_a_copycat_with_the_hash_but_not_the_model_gets_nothing(t: Tenancy) -> None:
    key = t.get("trtengines", t.b, "tiny")["status"]["targets"][0]["engineKey"]
    manifest = json.loads((t.store_dir / "engines" / key / "manifest.json").read_text())
    t.apply(
        {
            **engine("copy", "pvc://models/missing.onnx", t.sha),
            "metadata": {"name": "copy", "namespace": t.c},
        },
        {**localdev.deployment_manifest("copy", "copy"), "metadata": {"name": "copy", "namespace": t.c}},
    )

    def verify_failed() -> dict[str, Any] | None:
        obj = t.get("trtengines", t.c, "copy")
        targets = (obj.get("status") or {}).get("targets") or []
        return obj if targets and targets[0].get("reason") == "ModelVerifyFailed" else None

    obj = t.wait("the copycat's verify step fails", verify_failed)
    (target,) = obj["status"]["targets"]
    assert "missing.onnx" in target["message"] and not target.get("engineKey") and not target.get("cacheHit")
    assert not localdev.is_true(obj, "Ready")
    assert t.get("inferencedeployments", t.c, "copy").get("status", {}).get("ready") in (None, "0/0", "0/1")
    core: Any = client.CoreV1Api(t.api)
    assert not core.list_namespaced_pod(t.c, label_selector="app.kubernetes.io/component=runtime").items
    for f in (manifest["engine_file"], "manifest.json"):
        assert t.broker(t.c, "GET", f"/engines/{key}/{f}") == 403
    # Nor can it forge possession: only the operator's verify Jobs may upload at all.
    forged = t.broker(
        t.c, "PUT", f"/models/{t.sha}", data=b"not the model", **{"X-Trtforge-Source-Uri": "pvc://models/x"}
    )
    assert forged == 403
    assert t.broker(t.c, "GET", f"/engines/{key}/{manifest['engine_file']}") == 403


def test_paths_into_the_store_are_refused_and_the_store_is_untouched(t: Tenancy) -> None:
    key = t.get("trtengines", t.b, "tiny")["status"]["targets"][0]["engineKey"]
    manifest = json.loads((t.store_dir / "engines" / key / "manifest.json").read_text())
    before = t.store_snapshot()
    builds = {j.metadata.name for j in t.jobs(t.sysns, "builder")}
    # `..` out of a claim: refused at admission by the CRD's schema.
    dotdot = engine("dotdot", f"pvc://models/../trtforge-store/engines/{key}/{manifest['engine_file']}", None)
    res = t.apply({**dotdot, "metadata": {"name": "dotdot", "namespace": t.c}}, check=False)
    assert res.returncode != 0 and "spec.model.uri" in res.stderr, res.stderr
    # The store's claim by name: refused by the operator, with the reason, before any Job.
    direct = engine("direct", f"pvc://trtforge-store/engines/{key}/{manifest['engine_file']}", None)
    t.apply({**direct, "metadata": {"name": "direct", "namespace": t.c}})

    def refused() -> dict[str, Any] | None:
        c = localdev.condition(t.get("trtengines", t.c, "direct"), "Stalled")
        return c if c and c.get("status") == "True" else None

    stalled = t.wait("the store-path engine is refused", refused, timeout=60)
    assert stalled["reason"] == "InvalidModelSource" and "engine store's claim" in stalled["message"]
    # A symlink in the tenant's own claim that points into the store: the verify step refuses it.
    link = t.claims[t.c] / "link.onnx"
    link.symlink_to(t.store_dir / "engines" / key / manifest["engine_file"])
    t.apply(
        {**engine("link", "pvc://models/link.onnx", None), "metadata": {"name": "link", "namespace": t.c}}
    )

    def link_refused() -> dict[str, Any] | None:
        c = localdev.condition(t.get("trtengines", t.c, "link"), "Stalled")
        return c if c and c.get("status") == "True" else None

    stalled = t.wait("the symlinked source is refused", link_refused)
    assert stalled["reason"] == "ModelVerifyFailed" and "outside the claim" in stalled["message"]
    asked = {j.metadata.annotations.get("trtforge.io/created-for") for j in t.jobs(t.c, "verifier")}
    assert f"{t.c}/link" in asked and f"{t.c}/direct" not in asked, asked
    assert {j.metadata.name for j in t.jobs(t.sysns, "builder")} == builds
    assert t.store_snapshot() == before, "the store is untouched"
    digest = hashlib.sha256(link.resolve().read_bytes()).hexdigest()
    assert not (t.store_dir / "possession" / t.c).exists() or not any(
        digest in p.read_text() for p in (t.store_dir / "possession" / t.c).iterdir()
    )
