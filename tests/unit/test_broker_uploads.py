"""Who may upload a model to the engine broker (issue 52): only the pod of a verify Job the operator
created and recorded, only the digest that verification expects, only up to its size. The rule is
the broker's pure `upload_denial`; the HTTP surface runs on a real aiohttp server over a real store,
with `upload_denial` fed from the real store's grants."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from trtforge_operator.apply.children import VerifyRequest, verify_grant, verify_job
from trtforge_operator.broker import Denied, Identity, UploaderPod, make_app, upload_denial
from trtforge_operator.config import OperatorConfig
from trtforge_operator.store_reader import StoreReader

from trtforge.contract.llm import ArtefactKind
from trtforge.contract.possession import VerifyGrant, staged_model_path, verify_grant_path
from trtforge.store import open_store

NOW = 1_000_000.0
SHA = "a" * 64
CFG = OperatorConfig(builder_image="reg/trtforge-builder:1")
REQ = VerifyRequest(
    namespace="team-a",
    engine="resnet",
    engine_uid="engine-uid",
    model_uri="https://models.example/r.onnx",
    model_sha256=None,
    secret=None,
    fingerprint="f" * 64,
)
GRANT = verify_grant(REQ, CFG, NOW, job_uid="job-uid")
POD_SPEC = verify_job(REQ, CFG)["spec"]["template"]["spec"]
POD = UploaderPod(uid="pod-uid", job=REQ.job_name, job_uid="job-uid", spec=POD_SPEC)
JOB = {"metadata": {"uid": "job-uid"}, "status": {"active": 1}}


def _with(**container: Any) -> UploaderPod:
    """POD with its one container changed (a value of None removes the field)."""
    c = {**POD_SPEC["containers"][0], **container}
    return replace(POD, spec={**POD_SPEC, "containers": [{k: v for k, v in c.items() if v is not None}]})


def _pod(**spec: Any) -> UploaderPod:
    return replace(POD, spec={**POD_SPEC, **spec})


# What the apiserver gives back of the operator's own verify pod: defaults added, quantities canonical.
DEFAULTED = _pod(
    volumes=[
        {**v, "projected": {**v["projected"], "defaultMode": 420}}
        if "projected" in v
        else {**v, "emptyDir": {"medium": "", "sizeLimit": "20Gi"}}
        if "emptyDir" in v
        else v
        for v in POD_SPEC["volumes"]
    ],
    containers=[
        {
            **POD_SPEC["containers"][0],
            "volumeMounts": [
                {**m, "readOnly": bool(m.get("readOnly"))} for m in POD_SPEC["containers"][0]["volumeMounts"]
            ],
            "args": [],
        }
    ],
)
WHO = Identity("team-a", f"{REQ.job_name}-x7k2p", "pod-uid")


def test_the_grant_matches_the_job_the_operator_creates() -> None:
    job = verify_job(REQ, CFG)
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert (GRANT.job, GRANT.namespace) == (job["metadata"]["name"], job["metadata"]["namespace"])
    assert (GRANT.image, GRANT.command) == (c["image"], c["command"])
    assert (GRANT.env, GRANT.volume_mounts, GRANT.volumes) == (
        c["env"],
        c["volumeMounts"],
        job["spec"]["template"]["spec"]["volumes"],
    )
    assert GRANT.max_bytes == CFG.broker.max_model_bytes
    assert verify_grant(replace(REQ, max_bytes=10), CFG, NOW).max_bytes == 10
    assert verify_grant(replace(REQ, max_bytes=1 << 50), CFG, NOW).max_bytes == CFG.broker.max_model_bytes
    # the broker checks the bytes as what the source declares: an LLM's GGUF is not refused as ONNX
    assert GRANT.format == "onnx"
    assert verify_grant(replace(REQ, model_format="gguf"), CFG, NOW).format == "gguf"


@pytest.mark.parametrize(
    ("name", "who", "pod", "grant", "sha", "length", "status", "says"),
    [
        ("the operator's verify pod", WHO, POD, GRANT, SHA, 100, None, ""),
        ("the operator's verify pod as the apiserver defaults it", WHO, DEFAULTED, GRANT, SHA, 100, None, ""),
        (
            "its own PYTHONPATH",
            WHO,
            _with(env=[*POD_SPEC["containers"][0]["env"], {"name": "PYTHONPATH", "value": "/hook"}]),
            GRANT,
            SHA,
            1,
            403,
            "container's env is not what the operator rendered",
        ),
        (
            "a mounted sitecustomize.py",
            WHO,
            _pod(volumes=[*POD_SPEC["volumes"], {"name": "hook", "configMap": {"name": "hook"}}]),
            GRANT,
            SHA,
            1,
            403,
            "its volumes are not",
        ),
        (
            "another mount",
            WHO,
            _with(
                volumeMounts=[
                    *POD_SPEC["containers"][0]["volumeMounts"],
                    {"name": "scratch", "mountPath": "/x"},
                ]
            ),
            GRANT,
            SHA,
            1,
            403,
            "volumeMounts",
        ),
        ("its own arguments", WHO, _with(args=["--broker", "http://evil"]), GRANT, SHA, 1, 403, "args"),
        ("another working directory", WHO, _with(workingDir="/hook"), GRANT, SHA, 1, 403, "workingDir"),
        ("other envFrom", WHO, _with(envFrom=[{"secretRef": {"name": "x"}}]), GRANT, SHA, 1, 403, "envFrom"),
        ("length unknown: capped while spooled", WHO, POD, GRANT, SHA, None, None, ""),
        ("a token bound to no pod", Identity("team-a"), POD, GRANT, SHA, 1, 403, "bound to no pod"),
        ("the pod is gone", WHO, None, GRANT, SHA, 1, 403, "does not exist"),
        (
            "another pod of that name",
            replace(WHO, pod_uid="other"),
            POD,
            GRANT,
            SHA,
            1,
            403,
            "does not exist",
        ),
        (
            "a pod no Job controls",
            WHO,
            replace(POD, job="", job_uid=""),
            GRANT,
            SHA,
            1,
            403,
            "not a Job's pod",
        ),
        ("a Job the operator never recorded", WHO, POD, None, SHA, 1, 403, "not a pending verification"),
        (
            "a tenant's Job of the same name",
            WHO,
            replace(POD, job_uid="tenant-job-uid"),
            GRANT,
            SHA,
            1,
            403,
            "not the verify Job the operator created",
        ),
        (
            "a grant of another namespace",
            replace(WHO, namespace="team-b"),
            POD,
            GRANT,
            SHA,
            1,
            403,
            "not the verify Job",
        ),
        (
            "another image",
            WHO,
            _with(image="evil:1"),
            GRANT,
            SHA,
            1,
            403,
            "does not run what the operator gave",
        ),
        (
            "other arguments",
            WHO,
            _with(command=["sh", "-c", "curl ..."]),
            GRANT,
            SHA,
            1,
            403,
            "does not run what the operator gave",
        ),
        (
            "an extra container",
            WHO,
            _pod(containers=POD_SPEC["containers"] * 2),
            GRANT,
            SHA,
            1,
            403,
            "does not run",
        ),
        (
            "an init container",
            WHO,
            _pod(initContainers=POD_SPEC["containers"]),
            GRANT,
            SHA,
            1,
            403,
            "does not run",
        ),
        (
            "expired",
            WHO,
            POD,
            GRANT.model_copy(update={"expires_at": NOW - 1}),
            SHA,
            1,
            403,
            "expired",
        ),
        (
            "not the pinned digest",
            WHO,
            POD,
            GRANT.model_copy(update={"pin": "b" * 64}),
            SHA,
            1,
            403,
            "pinned",
        ),
        ("the pinned digest", WHO, POD, GRANT.model_copy(update={"pin": SHA}), SHA, 1, None, ""),
        (
            "larger than the verification accepts",
            WHO,
            POD,
            GRANT.model_copy(update={"max_bytes": 99}),
            SHA,
            100,
            413,
            "more than this verification accepts (99 bytes",
        ),
        ("being set up", WHO, POD, GRANT.model_copy(update={"job_uid": ""}), SHA, 1, 503, "retry"),
    ],
)
def test_upload_rule(
    name: str,
    who: Identity,
    pod: UploaderPod | None,
    grant: VerifyGrant | None,
    sha: str,
    length: int | None,
    status: int | None,
    says: str,
) -> None:
    why = upload_denial(who, pod, grant, sha, length, NOW, JOB)
    if status is None:
        assert why is None, name
    else:
        assert isinstance(why, Denied) and why.status == status and says in str(why), (name, why)


def test_the_pods_view_comes_from_its_controller_reference_only() -> None:
    pod = {
        "metadata": {
            "uid": "pod-uid",
            "labels": {"job-name": "trtforge-verify-forged"},  # labels count for nothing
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "not-controller", "uid": "u0"},
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": REQ.job_name,
                    "uid": "job-uid",
                    "controller": True,
                },
            ],
        },
        "spec": POD_SPEC,
    }
    assert UploaderPod.from_k8s(pod) == POD
    del pod["metadata"]["ownerReferences"][1]
    assert UploaderPod.from_k8s(pod).job == ""


class OneVerifyPod:
    """Every token is WHO on POD; the grant is what the real store holds (the broker's real rule)."""

    def __init__(self, store: StoreReader) -> None:
        self.store = store

    async def identify(self, token: str) -> Identity:
        if token != "verify-pod":
            raise Denied(401, "bad token")
        return WHO

    async def check_engine(self, who: Identity, key: str) -> None:
        raise Denied(403, "no engines here")

    async def check_artefact(self, who: Identity, kind: ArtefactKind, key: str) -> None:
        raise Denied(403, "no LLM artefacts here")

    async def check_upload(self, who: Identity, sha256: str, length: int | None) -> VerifyGrant:
        grant = self.store.verify_grant(who.namespace, POD.job)
        why = upload_denial(who, POD, grant, sha256, length, time.time(), JOB)
        if why is not None:
            raise why
        assert grant is not None
        return grant


@pytest_asyncio.fixture
async def broker(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    store = StoreReader(str(tmp_path / "store"))
    spool = tmp_path / "spool"
    spool.mkdir()
    app = make_app(store, OneVerifyPod(store), spool_dir=str(spool))
    async with TestClient(TestServer(app)) as c:
        yield c


def _everything(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.asyncio
async def test_an_upload_without_a_grant_is_403_and_writes_nothing(
    broker: TestClient[Any, Any], tmp_path: Path
) -> None:
    body = b"x" * 4096
    sha = hashlib.sha256(body).hexdigest()
    r = await broker.put(f"/models/{sha}", data=body, headers={"Authorization": "Bearer verify-pod"})
    assert r.status == 403 and "not a pending verification" in (await r.json())["error"]
    assert _everything(tmp_path / "store") == [] and _everything(tmp_path / "spool") == []


@pytest.mark.asyncio
async def test_an_oversize_upload_is_refused_before_anything_is_stored(
    broker: TestClient[Any, Any], tmp_path: Path
) -> None:
    store = open_store(str(tmp_path / "store"))
    small = GRANT.model_copy(update={"max_bytes": 1000, "expires_at": time.time() + 600})
    store.put_bytes(verify_grant_path(WHO.namespace, POD.job), small.to_json().encode())
    body = b"y" * 5000
    sha = hashlib.sha256(body).hexdigest()
    hdr = {"Authorization": "Bearer verify-pod"}
    r = await broker.put(f"/models/{sha}", data=body, headers=hdr)
    assert r.status == 413 and "1000 bytes" in (await r.json())["error"]

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: cut off while spooling
        for _ in range(5):
            yield b"y" * 1000
        yield b"y"

    r = await broker.put(f"/models/{sha}", data=chunked(), headers=hdr)
    assert r.status == 413
    assert _everything(tmp_path / "store") == [verify_grant_path(WHO.namespace, POD.job)]
    assert _everything(tmp_path / "spool") == []
    assert not store.exists(staged_model_path(sha))


@pytest.mark.parametrize(
    ("name", "job", "says"),
    [
        ("failed", {"metadata": {"uid": "job-uid"}, "status": {"failed": 1}}, "has finished"),
        (
            "failed, by its condition",
            {
                "metadata": {"uid": "job-uid"},
                "status": {"conditions": [{"type": "Failed", "status": "True"}]},
            },
            "has finished",
        ),
        ("succeeded", {"metadata": {"uid": "job-uid"}, "status": {"succeeded": 1}}, "has finished"),
        ("gone", None, "is gone"),
        (
            "another Job of that name",
            {"metadata": {"uid": "other"}, "status": {"active": 1}},
            "not the verify Job",
        ),
    ],
)
def test_a_grant_ends_with_its_job(name: str, job: dict[str, Any] | None, says: str) -> None:
    why = upload_denial(WHO, POD, GRANT, SHA, 1, NOW, job)
    assert isinstance(why, Denied) and why.status == 403 and says in str(why), (name, why)


def test_a_gguf_sources_grant_has_the_broker_check_a_gguf() -> None:
    """An LLM source (spec.llm.source.format gguf) is checked as a GGUF, an ONNX model as ONNX."""
    gguf = dataclasses.replace(REQ, model_uri="https://models.example/m.gguf", model_format="gguf")
    assert verify_grant(gguf, CFG, NOW).format == "gguf"
    assert GRANT.format == "onnx"
