"""The model-verify path trusts nothing a tenant writes (issue 52), on the test bed, with the operator
and the broker each under the chart's ServiceAccount and RBAC.

- A model upload from a pod that is not the pod of a verify Job the operator created for a pending
  verification gets 403 and writes nothing to the store, whatever its labels or headers say.
- An upload larger than the TRTEngine's declared limit is refused before it is stored.
- A verify pod that cannot start (a Secret that does not exist) shows why in the TRTEngine's status.
- The operator's own verify Job still uploads, and the record's source is the one its Job read.
- A pod a tenant makes with the operator's verify Job as its controller uploads nothing once that Job
  has failed, and nothing with its own env (a `PYTHONPATH`); a model framed as a ModelProto with one
  huge field is not stored even from the operator's own verify pod (issue 63).
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

from tests.integration.chart_release import (
    ChartOperatorBed,
    chart_broker,
    install_chart_rbac,
    sa_kubeconfig,
    sa_token,
    tenant_namespaces,
    uninstall_chart_rbac,
)
from trtforge.contract.possession import PossessionRecord, source_fingerprint

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TARGETS = [{"gpu": "NVIDIA-H100-80GB-HBM3"}]
AUDIENCE = "trtforge-broker"


class Bed(ChartOperatorBed):
    def __init__(self, tb: TestBed, rel: dict[str, str], tmp: Path) -> None:
        self.tb, self.rel = tb, rel
        self.sysns, self.a, self.b = rel["namespace"], rel["tenant"], rel["tenant2"]
        self.api = tb.api_client()
        self.core: Any = client.CoreV1Api(self.api)
        self.batch: Any = client.BatchV1Api(self.api)
        self.store_dir, _ = localdev.prepare_build_namespace(self.api, self.sysns)
        self.pvs: list[str] = []
        self.models = tmp / "models"
        for ns in (self.a, self.b):
            self.pvs.append(localdev.tenant_models_claim(self.api, ns, self.models / ns))
            sa_token(self.api, ns, "default")
        self.sha = localdev.tiny_model(self.models / self.a / "tiny.onnx", seed=5)
        assert localdev.tiny_model(self.models / self.b / "tiny.onnx", seed=5) == self.sha
        self.model_bytes = (self.models / self.a / "tiny.onnx").read_bytes()
        config = tmp / "operator.yaml"
        self.cfg = localdev.write_config(
            config,
            build_ns=self.sysns,
            namespaces=tenant_namespaces(rel),
            store_dir=self.store_dir,
            build_service_account="trtforge-builder",
            broker={"enabled": False},  # as the chart: the broker runs apart, under its own account
        )
        token = sa_token(self.api, self.sysns, rel["fullname"])
        self.op = localdev.OperatorProcess(
            config, sa_kubeconfig(tb, token, tmp / "operator.kubeconfig"), tmp / "operator.log"
        )
        self.broker_process = chart_broker(tb, rel, config, tmp)

    def store_files(self) -> set[str]:
        return {
            str((Path(d) / f).relative_to(self.store_dir))
            for d, _, files in os.walk(self.store_dir)
            for f in files
        }

    def token(self, ns: str, pod: dict[str, Any] | None = None) -> str:
        """A token of `ns`'s default ServiceAccount for the broker, bound to `pod` if given (what a
        projected token in that pod is)."""
        spec: dict[str, Any] = {"audiences": [AUDIENCE], "expirationSeconds": 600}
        if pod is not None:
            spec["boundObjectRef"] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            }
        res = self.core.create_namespaced_service_account_token("default", ns, {"spec": spec})
        return str(res.status.token)

    def put(self, token: str, data: bytes, sha: str, **headers: str) -> tuple[int, str]:
        req = urllib.request.Request(f"{self.cfg['broker']['url']}/models/{sha}", data=data, method="PUT")
        req.add_header("Authorization", f"Bearer {token}")
        for k, v in headers.items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            return int(e.code), e.read().decode()

    def broker_up(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.cfg['broker']['url']}/healthz", timeout=5) as r:
                return int(r.status) == 200
        except OSError:
            return False

    def pod_of(self, ns: str, selector: str) -> dict[str, Any]:
        def one() -> dict[str, Any] | None:
            pods = self.core.list_namespaced_pod(ns, label_selector=selector).items
            return self.api.sanitize_for_serialization(pods[0]) if pods else None

        found: dict[str, Any] = self.wait(f"a pod {selector} in {ns}", one, timeout=120)
        return found

    def target(self, ns: str, name: str) -> dict[str, Any]:
        targets = (self.get("trtengines", ns, name).get("status") or {}).get("targets") or []
        return dict(targets[0]) if targets else {}


def engine(name: str, ns: str, uri: str, sha: str | None, **model: Any) -> dict[str, Any]:
    e = localdev.engine_manifest(name, sha, TARGETS, model=uri)
    e["metadata"] = {"name": name, "namespace": ns}
    e["spec"]["model"].update(model)
    return e


@pytest.fixture(scope="module")
def bed(testbed: TestBed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    rel = install_chart_rbac(testbed, tenants=2)
    env = None
    try:
        env = Bed(testbed, rel, tmp_path_factory.mktemp("verify-trust"))
        env.broker_process.start()
        env.op.start()
        env.wait("the broker answers", env.broker_up, timeout=120)
        yield env
    finally:
        if env is not None:
            for ns in (env.a, env.b):
                testbed.kubectl("delete", "trtengines,jobs", "--all", "-n", ns, "--wait=false", check=False)
            env.op.stop()
            env.broker_process.stop()
            env.api.close()
        uninstall_chart_rbac(testbed, rel, env.pvs if env else [])


def test_an_upload_from_a_pod_that_is_no_pending_verify_job_is_403_and_writes_nothing(bed: Bed) -> None:
    # Tenant A's own Job, labelled and named as the operator's verify Jobs are, whose pod never runs
    # (no node matches); its pod gets a projected token as any pod does.
    job_name = "trtforge-verify-" + "0" * 20
    labels = {"app.kubernetes.io/managed-by": "trtforge-operator", "app.kubernetes.io/component": "verifier"}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": bed.a,
            "labels": labels,
            "annotations": {"trtforge.io/created-for": f"{bed.a}/tiny"},
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"no-such-node": "true"},
                    "containers": [{"name": "verify", "image": "trtforge-builder", "args": ["stage-model"]}],
                },
            },
        },
    }
    bed.apply(job)
    pod = bed.pod_of(bed.a, f"job-name={job_name}")
    before = bed.store_files()
    body = b"\x00" * (1 << 20)  # any bytes: the attacker names their digest
    sha = hashlib.sha256(body).hexdigest()
    forged = {"X-Trtforge-Source-Uri": "https://models.example/resnet.onnx"}
    for who, token in (
        ("a pod of a Job the tenant labelled as a verify Job", bed.token(bed.a, pod)),
        ("a token bound to no pod", bed.token(bed.a)),
        ("a namespace the operator does not watch", bed.token(bed.sysns)),
    ):
        status, answer = bed.put(token, body, sha, **forged)
        assert status == 403, (who, status, answer)
    # The model's real digest with its real bytes is refused the same way.
    status, _ = bed.put(bed.token(bed.a, pod), bed.model_bytes, bed.sha, **forged)
    assert status == 403
    after = bed.store_files()
    assert after == before, sorted(after - before)
    assert not [f for f in after if f.startswith(("models/", "possession/"))]


def test_an_oversize_model_is_refused_before_it_is_stored(bed: Bed) -> None:
    size = len(bed.model_bytes)
    bed.apply(engine("small", bed.a, "pvc://models/tiny.onnx", bed.sha, maxSizeBytes=size // 2))

    def refused() -> dict[str, Any] | None:
        t = bed.target(bed.a, "small")
        return t if t.get("reason") == "ModelVerifyFailed" else None

    t = bed.wait("the oversize model's verify fails", refused)
    assert "more than this verification accepts" in t["message"] and str(size // 2) in t["message"], t
    fp = source_fingerprint("pvc://models/tiny.onnx", None, bed.sha)
    assert not (bed.store_dir / "models" / bed.sha).exists()
    assert not (bed.store_dir / "possession" / bed.a / f"{fp}.json").exists()


def test_the_operators_own_verify_job_uploads_and_records_the_source_it_read(bed: Bed) -> None:
    uri = "pvc://models/tiny.onnx"
    bed.apply(engine("tiny", bed.b, uri, None))
    fp = source_fingerprint(uri, None, None)
    record = bed.store_dir / "possession" / bed.b / f"{fp}.json"
    bed.wait("B's verify step records possession", record.exists)
    rec = PossessionRecord.from_json(record.read_bytes())
    assert (rec.namespace, rec.uri, rec.sha256) == (bed.b, uri, bed.sha)
    assert rec.pod.startswith("trtforge-verify-")
    assert (bed.store_dir / "models" / bed.sha / "model.onnx").read_bytes() == bed.model_bytes
    # The grant is used up: the same pod's token cannot record anything more. (The broker writes the
    # record first and deletes the grant after it, so that a crash between the two loses nothing.)
    grants = bed.store_dir / "verify-grants" / bed.b
    bed.wait("B's verify grant used up", lambda: not list(grants.glob("*.json")))


def test_a_verify_pod_stuck_on_a_missing_secret_shows_the_reason(bed: Bed) -> None:
    bed.apply(
        engine(
            "locked", bed.a, "https://models.example/locked.onnx", None, secretRef={"name": "no-such-secret"}
        )
    )

    def shown() -> dict[str, Any] | None:
        t = bed.target(bed.a, "locked")
        return t if "no-such-secret" in (t.get("message") or "") else None

    t = bed.wait("the missing Secret shows in the status", shown, timeout=60)
    assert "cannot start its pod" in t["message"] and "CreateContainerConfigError" in t["message"], t
    assert json.dumps(t).count("no-such-secret") >= 1


# --- issue 63: a verify pod is matched whole, a grant ends with its Job, and only the declared format
# is stored.


def verify_job_of(bed: Bed, ns: str, uri: str, state: str) -> dict[str, Any]:
    """The operator's verify Job for `uri` in `ns`, once it is `state` ("active" or "failed")."""
    fp = source_fingerprint(uri, None, None)

    def found() -> dict[str, Any] | None:
        for j in bed.batch.list_namespaced_job(ns).items:
            if (j.metadata.annotations or {}).get("trtforge.io/model-source-fingerprint") == fp and getattr(
                j.status, state
            ):
                return dict(bed.api.sanitize_for_serialization(j))
        return None

    got: dict[str, Any] = bed.wait(f"a {state} verify Job for {uri} in {ns}", found, timeout=180)
    return got


def hand_made_pod(bed: Bed, job: dict[str, Any], name: str, **container: Any) -> tuple[dict[str, Any], str]:
    """A pod the tenant creates with `job` as its controller and the Job's own pod spec (changed by
    `container`), kept off every node; and a broker token bound to it."""
    spec = json.loads(json.dumps(job["spec"]["template"]["spec"]))
    c = spec["containers"][0]
    for k, v in container.items():
        c[k] = v
    spec["nodeSelector"] = {"no-such-node": "true"}
    meta = job["metadata"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": spec,
    }
    made = bed.api.sanitize_for_serialization(bed.core.create_namespaced_pod(meta["namespace"], pod))
    sa = spec.get("serviceAccountName") or "default"
    req = {
        "spec": {
            "audiences": [AUDIENCE],
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": name,
                "uid": made["metadata"]["uid"],
            },
        }
    }
    token = bed.core.create_namespaced_service_account_token(sa, meta["namespace"], req).status.token
    return made, str(token)


NOT_ONNX = os.urandom(1 << 16)


def stored(bed: Bed) -> set[str]:
    """The staged models and possession records in the store (what an upload writes)."""
    return {f for f in bed.store_files() if f.startswith(("models/", "possession/"))}


def test_a_hand_made_pod_of_a_failed_verify_job_uploads_nothing(bed: Bed) -> None:
    uri = "pvc://models/no-such-model.onnx"
    bed.apply(engine("failed", bed.a, uri, None))
    job = verify_job_of(bed, bed.a, uri, "failed")  # the model is not there: the verify pod failed
    grant = bed.store_dir / "verify-grants" / bed.a / f"{job['metadata']['name']}.json"
    assert grant.exists(), "the operator's record of the Job is still in the store"
    before = stored(bed)
    # The Job's own pod spec: the grant ended with the Job.
    _, token = hand_made_pod(bed, job, "after-the-failure")
    for body, sha in ((NOT_ONNX, hashlib.sha256(NOT_ONNX).hexdigest()), (bed.model_bytes, bed.sha)):
        status, answer = bed.put(token, body, sha)
        assert status == 403 and "has finished" in answer, (status, answer)
    # Its own PYTHONPATH (a mounted sitecustomize.py): not the pod the operator rendered.
    c = job["spec"]["template"]["spec"]["containers"][0]
    hook = [*c.get("env", []), {"name": "PYTHONPATH", "value": "/tmp/hook"}]
    _, token = hand_made_pod(bed, job, "own-env", env=hook)
    status, answer = bed.put(token, NOT_ONNX, hashlib.sha256(NOT_ONNX).hexdigest())
    assert status == 403 and "env is not what the operator rendered" in answer, (status, answer)
    assert stored(bed) == before


def test_a_model_framed_with_one_huge_field_is_not_stored(bed: Bed) -> None:
    # A real ModelProto with a 3.9 MB doc_string appended: its top-level framing is ONNX's, so the
    # operator's own verify pod uploads it, and only the broker's check of every field refuses it.
    huge = b"\0" * 3_900_000
    n, size = 6 << 3 | 2, bytearray()
    length = len(huge)
    while True:
        size.append((length & 0x7F) | (0x80 if length >> 7 else 0))
        length >>= 7
        if not length:
            break
    framed = bed.model_bytes + bytes([n]) + bytes(size) + huge
    (bed.models / bed.b / "framed.onnx").write_bytes(framed)
    sha = hashlib.sha256(framed).hexdigest()
    uri = "pvc://models/framed.onnx"
    bed.apply(engine("framed", bed.b, uri, None))
    record = bed.store_dir / "possession" / bed.b / f"{source_fingerprint(uri, None, None)}.json"

    def outcome() -> str:
        if record.exists():
            return "stored"
        return "refused" if "not an ONNX model" in (bed.target(bed.b, "framed").get("message") or "") else ""

    assert bed.wait("the broker's answer to the framed model", outcome, timeout=180) == "refused"
    assert "doc_string is 3900000 bytes" in bed.target(bed.b, "framed")["message"]
    assert not record.exists() and not (bed.store_dir / "models" / sha).exists()
