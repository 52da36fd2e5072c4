"""TRTEngine planning: targets, keys, cache hits, one Job per key, retries, Stalled, no status churn."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from trtforge_operator.api import TRTEngine, get_condition
from trtforge_operator.apply import children
from trtforge_operator.config import OperatorConfig
from trtforge_operator.labels import (
    ANNOTATION_REQUEST_DIGEST,
    LABEL_TARGET,
    requester_annotation,
)
from trtforge_operator.observe.keys import key_inputs
from trtforge_operator.observe.views import Capacity, EngineObserved, JobView, NodeView
from trtforge_operator.planning.engine import model_source_problem, plan_engine

from tests.fakes import default_nodes, gpu_node, job
from trtforge.contract.build_result import BuildFailure
from trtforge.contract.engine_key import RequestRecord
from trtforge.contract.gpu import GPUTarget, known_identity
from trtforge.contract.manifest import Accuracy, CanaryRef, Manifest
from trtforge.contract.possession import PossessionRecord, source_fingerprint

SHA = "a" * 64
NOW = 1_800_000_000.0
CFG = OperatorConfig(
    backends={"gpu": "onnxruntime", "cpu": "onnxruntime"},
    build={"retry_base_seconds": 30, "max_attempts": 3},
    cache={"sharing": "all"},
)
H100 = GPUTarget(gpu="NVIDIA-H100-80GB-HBM3")
GH200 = GPUTarget(gpu="NVIDIA-GH200-480GB")
B200_MIG = GPUTarget(gpu="NVIDIA-B200", mig="1g.23gb")


def engine(
    targets: list[dict[str, Any]] | None = None,
    sha: str | None = SHA,
    name: str = "resnet",
    namespace: str = "team-a",
    **spec: Any,
) -> TRTEngine:
    model: dict[str, Any] = {"uri": "pvc://models/resnet.onnx"}
    if sha:
        model["sha256"] = sha
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "generation": 1, "uid": "u1"},
        "spec": {"model": model, **spec},
    }
    if targets is not None:
        body["spec"]["targets"] = targets
    return TRTEngine.model_validate(body)


def observe(
    e: TRTEngine,
    *,
    jobs: Sequence[dict[str, Any]] = (),
    manifests: dict[str, Manifest] | None = None,
    nodes: list[dict[str, Any]] | None = None,
    now: float = NOW,
    running: int = 0,
    cfg: OperatorConfig = CFG,
    filed: dict[str, str] | None = None,
    verified: str | None = "pin",
    verify_jobs: Sequence[dict[str, Any]] = (),
    verify_failures: dict[str, BuildFailure] | None = None,
    cache_scope: str = "",
) -> EngineObserved:
    """`filed`: the store's request index (request key -> engine key); by default every request whose
    engine (:func:`engine_for`) is among `manifests` was filed, as a builder does. `verified`: "pin"
    (default) — the namespace proved it holds the pinned model (or SHA); a digest — it proved that
    one; None — no proof yet."""
    manifests = manifests or {}
    ns, m = e.metadata.namespace or "", e.spec.model
    fp = source_fingerprint(m.uri, m.secret_ref.name if m.secret_ref else None, m.sha256)
    digest = (m.sha256 or SHA) if verified == "pin" else verified
    record = (
        PossessionRecord(
            namespace=ns, fingerprint=fp, sha256=digest, size_bytes=10, uri=m.uri, verified_at=NOW
        )
        if digest
        else None
    )
    requests = FiledRequests(filed, manifests)

    return EngineObserved(
        namespace=e.metadata.namespace or "",
        name=e.metadata.name or "",
        generation=e.metadata.generation or 1,
        spec=e.spec,
        status=e.status,
        nodes=[NodeView.from_k8s(n) for n in (nodes or default_nodes())],
        jobs=[JobView.from_k8s(j) for j in jobs],
        manifests=manifests,
        capacity=Capacity(running, running, cfg.build.max_concurrent, cfg.build.max_concurrent_per_namespace),
        now=now,
        requests=requests,
        uid="u1",
        possession=record,
        verify_jobs=[JobView.from_k8s(j) for j in verify_jobs],
        verify_failures=verify_failures or {},
        cache_scope=cache_scope,
    )


class FiledRequests(Mapping[str, RequestRecord]):
    """The store's request index as the observer reads it: `filed` (request key -> engine key), or by
    default every request whose engine (:func:`engine_for`) is among `manifests`."""

    def __init__(self, filed: dict[str, str] | None, manifests: dict[str, Manifest]) -> None:
        self.filed, self.manifests = filed, manifests

    def __getitem__(self, rk: str) -> RequestRecord:
        ek = self.filed.get(rk) if self.filed is not None else engine_for(rk)
        if ek is None or (self.filed is None and ek not in self.manifests):
            raise KeyError(rk)
        return RequestRecord(
            request_key=rk,
            engine_key=ek,
            backend="onnxruntime",
            backend_version="1.22.0",
            cuda="none",
            recipe=2,
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.filed or ())

    def __len__(self) -> int:
        return len(self.filed or ())


def manifest_for(key: str, target: GPUTarget, sha256: str = "b" * 64) -> Manifest:
    ident = known_identity(target)
    return Manifest(
        key=key,
        engine_file="model.onnx",
        sha256=sha256,
        size_bytes=1234,
        backend="onnxruntime",
        backend_version="1.22.0",
        cuda="none",
        gpu=ident,
        build=engine([{"gpu": target.gpu}]).spec.build_config(),
        model_uri="pvc://models/resnet.onnx",
        model_sha256=SHA,
        inputs=[],
        outputs=[],
        build_seconds=4.2,
        accuracy=Accuracy(
            samples=8, max_abs_error=1e-4, max_rel_error=1e-3, atol=1e-3, rtol=1e-2, passed=True
        ),
        canary=CanaryRef(file="canary.npz", sha256="c" * 64, atol=1e-3, rtol=1e-2),
    )


def built(key: str, cache_hit: bool = False) -> dict[str, Any]:
    return {
        "key": key,
        "uri": f"pvc://s/engines/{key}/model.onnx",
        "manifestUri": "m",
        "sha256": "b" * 64,
        "sizeBytes": 1,
        "backend": "onnxruntime",
        "backendVersion": "1.22.0",
        "computeCapability": "9.0",
        "gpu": "NVIDIA-H100-80GB-HBM3",
        "buildSeconds": 4.2,
        "totalSeconds": 5.0,
        "cacheHit": cache_hit,
    }


def rkey_of(e: TRTEngine, target: GPUTarget, cfg: OperatorConfig = CFG) -> str:
    """The request key the operator computes for a target (it names the build Job)."""
    return key_inputs(e.spec, target, [NodeView.from_k8s(n) for n in default_nodes()], cfg).request_key


def engine_for(rk: str) -> str:
    """The engine key a builder would report for request `rk` (any key the operator cannot predict)."""
    return hashlib.sha256(f"engine built for {rk}".encode()).hexdigest()


def key_of(e: TRTEngine, target: GPUTarget, cfg: OperatorConfig = CFG) -> str:
    return engine_for(rkey_of(e, target, cfg))


def with_status(e: TRTEngine, plan_status: Any) -> TRTEngine:
    return e.model_copy(update={"status": plan_status})


def test_one_job_per_target_pinned_to_its_gpu_type() -> None:
    e = engine([{"gpu": H100.gpu}, {"gpu": GH200.gpu}, {"gpu": B200_MIG.gpu, "mig": "1g.23gb"}])
    plan = plan_engine(observe(e), CFG)
    assert len(plan.jobs_to_create) == 3
    by_target = {j["metadata"]["labels"][LABEL_TARGET]: j for j in plan.jobs_to_create}
    h100 = by_target[H100.name]["spec"]["template"]["spec"]
    assert h100["nodeSelector"]["nvidia.com/gpu.product"] == H100.gpu
    assert h100["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    gh = by_target[GH200.name]["spec"]["template"]["spec"]
    assert gh["nodeSelector"]["kubernetes.io/arch"] == "arm64"
    mig = by_target[B200_MIG.name]["spec"]["template"]["spec"]
    assert mig["containers"][0]["resources"]["limits"] == {
        "memory": CFG.build.memory,
        "nvidia.com/mig-1g.23gb": "1",
    }
    assert mig["nodeSelector"]["nvidia.com/mig.config.state"] == "success"
    # The name is derived from the key: the same request always names the same Job.
    assert by_target[H100.name]["metadata"]["name"] == f"trtforge-build-{rkey_of(e, H100)[:20]}"
    assert all(t.phase == "Building" for t in plan.status.targets)
    assert get_condition(plan.status.conditions, "Building").status == "True"  # type: ignore[union-attr]
    assert get_condition(plan.status.conditions, "Ready").status == "False"  # type: ignore[union-attr]
    assert plan.status.ready_targets == "0/3"


def test_build_pods_are_pss_restricted_and_bounded() -> None:
    plan = plan_engine(observe(engine([{"gpu": H100.gpu}])), CFG)
    j = plan.jobs_to_create[0]
    pod = j["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any("hostPath" in v for v in pod["volumes"])
    assert j["spec"]["activeDeadlineSeconds"] > 0 and j["spec"]["backoffLimit"] == 0
    assert c["command"][:2] == ["trtforge", "build"] and "--store" in c["command"]
    assert "ownerReferences" not in j["metadata"]  # shared across namespaces


def test_stored_manifest_means_ready_cache_hit_and_no_job() -> None:
    e = engine([{"gpu": H100.gpu}], namespace="team-b")
    key = key_of(e, H100)
    plan = plan_engine(observe(e, manifests={key: manifest_for(key, H100)}), CFG)
    assert plan.jobs_to_create == []
    (t,) = plan.status.targets
    assert (t.phase, t.cache_hit, t.engine_key, t.sha256) == ("Ready", True, key, "b" * 64)
    assert t.engine_uri and t.engine_uri.endswith(f"engines/{key}/model.onnx")
    assert get_condition(plan.status.conditions, "Ready").status == "True"  # type: ignore[union-attr]


def test_key_does_not_depend_on_namespace_or_name() -> None:
    a = engine([{"gpu": H100.gpu}], namespace="team-a", name="x")
    b = engine([{"gpu": H100.gpu}], namespace="team-b", name="y")
    assert rkey_of(a, H100) == rkey_of(b, H100)
    assert rkey_of(a, H100) != rkey_of(engine([{"gpu": H100.gpu}], precision="fp32"), H100)


def test_a_running_job_of_another_requester_is_reused_not_duplicated() -> None:
    a = engine([{"gpu": H100.gpu}], namespace="team-a")
    created = plan_engine(observe(a), CFG).jobs_to_create
    b = engine([{"gpu": H100.gpu}], namespace="team-b")
    plan = plan_engine(observe(b, jobs=[job(created[0], at=NOW - 5)]), CFG)
    assert plan.jobs_to_create == []
    assert plan.add_requester == [created[0]["metadata"]["name"]]
    assert plan.status.targets[0].phase == "Building"


def test_unpinned_model_is_keyed_by_the_digest_its_verify_step_proved() -> None:
    e = engine([{"gpu": H100.gpu}], sha=None)
    digest = "d" * 64
    (j,) = plan_engine(observe(e, verified=digest), CFG).jobs_to_create
    rk = rkey_of(engine([{"gpu": H100.gpu}], sha=digest), H100)
    assert j["metadata"]["annotations"][ANNOTATION_REQUEST_DIGEST] == rk
    cmd = j["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--sha256") + 1] == digest and "--staged-model" in cmd
    key = engine_for(rk)  # another namespace's build filed it: found through the index
    plan = plan_engine(observe(e, verified=digest, manifests={key: manifest_for(key, H100)}), CFG)
    (t,) = plan.status.targets
    assert (t.phase, t.engine_key) == ("Ready", key)
    assert plan.status.model is not None and plan.status.model.sha256 == digest


def test_failed_build_backs_off_retries_under_a_new_name_then_stalls() -> None:
    e = engine([{"gpu": H100.gpu}])
    (j1,) = plan_engine(observe(e), CFG).jobs_to_create
    failed1 = job(
        j1, state="failed", at=NOW - 15, result={"reason": "BuildFailed", "error": "unsupported op Foo"}
    )
    # Within the backoff: no new Job, Failed with the reason in one line, a requeue.
    plan = plan_engine(observe(e, jobs=[failed1]), CFG)
    assert plan.jobs_to_create == []
    (t,) = plan.status.targets
    assert t.phase == "Failed" and "unsupported op Foo" in (t.message or "") and "\n" not in (t.message or "")
    assert plan.requeue_after is not None and 0 < plan.requeue_after <= 30
    assert get_condition(plan.status.conditions, "Degraded").status == "True"  # type: ignore[union-attr]
    assert get_condition(plan.status.conditions, "Stalled").status == "False"  # type: ignore[union-attr]
    # After it: attempt 2 with its own name.
    plan = plan_engine(observe(e, jobs=[failed1], now=NOW + 60), CFG)
    (j2,) = plan.jobs_to_create
    assert j2["metadata"]["name"] == j1["metadata"]["name"] + "-a2"
    failed2 = job(j2, state="failed", at=NOW + 60)
    (j3,) = plan_engine(observe(e, jobs=[failed1, failed2], now=NOW + 200), CFG).jobs_to_create
    failed3 = job(j3, state="failed", at=NOW + 200, reason="DeadlineExceeded")
    plan = plan_engine(observe(e, jobs=[failed1, failed2, failed3], now=NOW + 10_000), CFG)
    assert plan.jobs_to_create == []
    stalled = get_condition(plan.status.conditions, "Stalled")
    assert stalled is not None and stalled.status == "True" and stalled.reason == "BuildRetriesExhausted"
    assert "deadline" in (plan.status.targets[0].message or "")


def test_concurrency_limit_queues_builds() -> None:
    e = engine([{"gpu": H100.gpu}, {"gpu": GH200.gpu}])
    cfg = CFG.model_copy(update={"build": CFG.build.model_copy(update={"max_concurrent_per_namespace": 1})})
    plan = plan_engine(observe(e, cfg=cfg), cfg)
    assert len(plan.jobs_to_create) == 1
    assert sorted(t.phase for t in plan.status.targets) == ["Building", "Pending"]
    assert any(t.reason == "Queued" for t in plan.status.targets)
    assert plan.waiting_for_slot, "a refused build asks to be woken when a slot frees"
    assert not plan_engine(observe(e), CFG).waiting_for_slot, "every build admitted: nothing to wait for"


def test_auto_targets_from_node_labels_mig_only_when_configured() -> None:
    e = engine(sha=SHA, autoTargets={"enabled": True})
    nodes = [*default_nodes(), gpu_node("b200-pending", "NVIDIA-B200", 1, mig={"2g.45gb": 3})]
    nodes[-1]["metadata"]["labels"]["nvidia.com/mig.config.state"] = "pending"
    names = {t.name for t in plan_engine(observe(e, nodes=nodes), CFG).status.targets}
    assert names == {"h100-80gb-hbm3", "gh200-480gb", "b200-mig-1g-23gb", "b200-mig-3g-90gb"}
    e2 = engine(
        sha=SHA,
        autoTargets={"enabled": True, "includeMIG": False, "nodeSelector": {"kubernetes.io/arch": "arm64"}},
    )
    assert [t.name for t in plan_engine(observe(e2), CFG).status.targets] == ["gh200-480gb"]


def test_no_node_for_a_target_is_pending_without_a_job() -> None:
    e = engine([{"gpu": "NVIDIA-B200"}])  # the test bed's B200 is MIG-only
    plan = plan_engine(observe(e), CFG)
    assert plan.jobs_to_create == []
    assert plan.status.targets[0].reason == "NoMatchingNode"


def test_unknown_mig_profile_waits_for_a_node_with_a_hint_from_the_table() -> None:
    """Which targets exist is the nodes' word (GFD labels); the known-GPU table only adds a hint."""
    e = engine([{"gpu": H100.gpu, "mig": "5g.99gb"}])
    plan = plan_engine(observe(e), CFG)
    (t,) = plan.status.targets
    assert (t.phase, t.reason) == ("Pending", "NoMatchingNode") and plan.jobs_to_create == []
    assert "not known to have MIG profile 5g.99gb" in (t.message or "") and "1g.10gb" in (t.message or "")


def test_replanning_the_same_state_is_a_fixed_point() -> None:
    """No churn: planning again from the status just written yields the same status (no write)."""
    e = engine([{"gpu": H100.gpu}, {"gpu": GH200.gpu}])
    key = key_of(e, H100)
    jobs = [job(j, at=NOW - 5) for j in plan_engine(observe(e), CFG).jobs_to_create]
    obs = observe(e, jobs=jobs, manifests={key: manifest_for(key, H100)})
    first = plan_engine(obs, CFG)
    e2 = with_status(e, first.status)
    second = plan_engine(observe(e2, jobs=jobs, manifests={key: manifest_for(key, H100)}, now=NOW + 300), CFG)
    assert second.status.to_wire() == first.status.to_wire()
    assert second.events == []


def test_condition_transition_time_moves_only_on_flips() -> None:
    e = engine([{"gpu": H100.gpu}])
    key = key_of(e, H100)
    (j,) = plan_engine(observe(e), CFG).jobs_to_create
    p1 = plan_engine(observe(e, jobs=[job(j, at=NOW)]), CFG)
    e1 = with_status(e, p1.status)
    p2 = plan_engine(
        observe(
            e1,
            jobs=[job(j, state="complete", at=NOW, result=built(key))],
            manifests={key: manifest_for(key, H100)},
            now=NOW + 100,
        ),
        CFG,
    )
    ready1, ready2 = (get_condition(p.status.conditions, "Ready") for p in (p1, p2))
    assert ready1 and ready2 and ready2.status == "True"
    assert ready2.last_transition_time.timestamp() == NOW + 100
    stalled1, stalled2 = (get_condition(p.status.conditions, "Stalled") for p in (p1, p2))
    assert stalled1 and stalled2 and stalled1.last_transition_time == stalled2.last_transition_time
    assert [ev.reason for ev in p2.events] == ["EngineReady"]


def test_rebuild_job_keeps_target_ready_while_it_runs() -> None:
    e = engine([{"gpu": H100.gpu}])
    key = key_of(e, H100)
    req = children.BuildRequest(
        target=H100,
        model_uri="pvc://models/resnet.onnx",
        model_sha256=SHA,
        build=e.spec.build_config(),
        engine_key=key,
        request_digest="0" * 64,
        node_selector={},
        requester="team-a/resnet",
        rebuild_of="f00dfeed",
    )
    rb = job(children.build_job(req, CFG), at=NOW)
    plan = plan_engine(observe(e, jobs=[rb], manifests={key: manifest_for(key, H100)}), CFG)
    assert plan.status.targets[0].phase == "Ready" and plan.status.targets[0].reason == "Rebuilding"
    assert get_condition(plan.status.conditions, "Building").reason == "Rebuilding"  # type: ignore[union-attr]
    assert "--rebuild" in rb["spec"]["template"]["spec"]["containers"][0]["command"]
    assert rb["metadata"]["name"].endswith("-rbf00dfeed")


@pytest.mark.parametrize(
    "attempt,rebuild,expected",
    [
        (1, None, "trtforge-build-0123456789abcdef0123"),
        (2, None, "trtforge-build-0123456789abcdef0123-a2"),
        (1, "deadbeef00", "trtforge-build-0123456789abcdef0123-rbdeadbeef"),
    ],
)
def test_job_names_are_derived_and_short(attempt: int, rebuild: str | None, expected: str) -> None:
    name = children.job_name("0123456789abcdef0123", attempt, rebuild)
    assert name == expected and len(name) <= 63


def test_invalid_model_is_not_retried() -> None:
    e = engine([{"gpu": H100.gpu}])
    (j1,) = plan_engine(observe(e), CFG).jobs_to_create
    bad = job(j1, state="failed", at=NOW - 15, result={"reason": "InvalidModel", "error": "truncated ONNX"})
    plan = plan_engine(observe(e, jobs=[bad], now=NOW + 10_000), CFG)
    assert plan.jobs_to_create == []
    stalled = get_condition(plan.status.conditions, "Stalled")
    assert stalled is not None and stalled.status == "True" and stalled.reason == "InvalidBuildInput"
    assert "truncated ONNX" in stalled.message


def test_no_build_and_no_cache_hit_before_the_namespace_proves_it_holds_the_model() -> None:
    e = engine([{"gpu": H100.gpu}], namespace="team-a")
    key = key_of(e, H100)
    # The store has the engine (another tenant built it), but team-a has not proven possession.
    plan = plan_engine(observe(e, verified=None, manifests={key: manifest_for(key, H100)}), CFG)
    assert plan.jobs_to_create == []
    (t,) = plan.status.targets
    assert (t.phase, t.reason, t.engine_key, t.cache_hit) == ("Pending", "VerifyingModel", None, None)
    (vj,) = plan.verify_jobs_to_create
    assert vj["metadata"]["namespace"] == "team-a" and vj["metadata"]["name"].startswith("trtforge-verify-")
    assert get_condition(plan.status.conditions, "Ready").status == "False"  # type: ignore[union-attr]
    # While it runs: nothing new.
    running = plan_engine(observe(e, verified=None, verify_jobs=[job(vj, at=NOW)]), CFG)
    assert running.verify_jobs_to_create == [] and running.status.targets[0].reason == "VerifyingModel"
    # Proven: a cache hit, no Job.
    hit = plan_engine(observe(e, manifests={key: manifest_for(key, H100)}), CFG)
    assert hit.jobs_to_create == [] and hit.verify_jobs_to_create == []
    assert hit.status.targets[0].cache_hit is True


def test_a_failed_verify_says_why_and_a_pin_mismatch_stalls() -> None:
    e = engine([{"gpu": H100.gpu}])
    (vj,) = plan_engine(observe(e, verified=None), CFG).verify_jobs_to_create
    failed = job(vj, state="failed", at=NOW - 15)
    missing = BuildFailure(error="model pvc://models/resnet.onnx: no such file", reason="ModelFetchFailed")
    plan = plan_engine(
        observe(e, verified=None, verify_jobs=[failed], verify_failures={vj["metadata"]["name"]: missing}),
        CFG,
    )
    (t,) = plan.status.targets
    assert (t.phase, t.reason) == ("Failed", "ModelVerifyFailed") and "no such file" in (t.message or "")
    assert plan.requeue_after is not None and plan.jobs_to_create == []
    later = plan_engine(
        observe(
            e,
            verified=None,
            verify_jobs=[failed],
            verify_failures={vj["metadata"]["name"]: missing},
            now=NOW + 60,
        ),
        CFG,
    )
    (vj2,) = later.verify_jobs_to_create
    assert vj2["metadata"]["name"] == vj["metadata"]["name"] + "-a2"
    wrong = BuildFailure(error="model has sha256 0000, but --sha256 pins aaaa", reason="ModelIntegrity")
    plan = plan_engine(
        observe(e, verified=None, verify_jobs=[failed], verify_failures={vj["metadata"]["name"]: wrong}), CFG
    )
    stalled = get_condition(plan.status.conditions, "Stalled")
    assert stalled is not None and stalled.status == "True" and stalled.reason == "ModelVerifyFailed"


def test_a_changed_model_source_is_verified_again() -> None:
    e = engine([{"gpu": H100.gpu}])
    other = engine([{"gpu": H100.gpu}], model={"uri": "s3://bucket/resnet.onnx", "sha256": SHA})
    obs = observe(e)  # proven for pvc://models/resnet.onnx
    moved = dataclasses.replace(obs, spec=other.spec)
    plan = plan_engine(moved, CFG)
    assert plan.jobs_to_create == [] and plan.status.targets[0].reason == "VerifyingModel"
    (vj,) = plan.verify_jobs_to_create
    cmd = vj["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--model") + 1] == "s3://bucket/resnet.onnx"


def test_verify_job_reads_the_tenants_own_source_and_builds_read_only_the_staged_copy() -> None:
    e = engine([{"gpu": H100.gpu}], model={"uri": "s3://bucket/m.onnx", "secretRef": {"name": "creds"}})
    (vj,) = plan_engine(observe(e, verified=None), CFG).verify_jobs_to_create
    pod = vj["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert vj["metadata"]["namespace"] == "team-a"
    assert c["envFrom"] == [{"secretRef": {"name": "creds"}}]  # its own Secret, never a copy
    assert (
        pod["serviceAccountName"] == CFG.runtime_service_account and not pod["automountServiceAccountToken"]
    )
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])  # no store, no claim
    assert vj["metadata"]["ownerReferences"][0]["kind"] == "TRTEngine"
    pvc = engine([{"gpu": H100.gpu}])
    (vj,) = plan_engine(observe(pvc, verified=None), CFG).verify_jobs_to_create
    pod = vj["spec"]["template"]["spec"]
    (claim,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert all(m["readOnly"] for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model")
    # The build: no Secret, no tenant claim; the store with least access.
    (bj,) = plan_engine(observe(e), CFG).jobs_to_create
    bpod = bj["spec"]["template"]["spec"]
    assert "envFrom" not in bpod["containers"][0]
    mounts = {
        m["mountPath"].rsplit("/", 1)[-1]: m
        for m in bpod["containers"][0]["volumeMounts"]
        if m["name"] == "store"
    }
    assert set(mounts) == {"engines", "requests", "timing-caches", "models"}
    assert mounts["models"].get("readOnly") is True and not mounts["engines"].get("readOnly")


@pytest.mark.parametrize(
    "uri, problem",
    [
        ("pvc://trtforge-store/engines/" + "e" * 64 + "/model.onnx", "engine store's claim"),
        ("pvc://models/../trtforge-store/x.onnx", "plain names"),
        ("pvc://models//etc/passwd", "plain names"),
        ("pvc://models/ok/model.onnx", None),
        ("s3://bucket/../x", None),
    ],
)
def test_model_sources_stay_inside_the_tenant(uri: str, problem: str | None) -> None:
    got = model_source_problem(uri, "pvc://trtforge-store/")
    assert (got is None) if problem is None else (got is not None and problem in got)


def test_cache_scopes_follow_the_sharing_policy() -> None:
    shared = CFG.cache.model_copy(update={"sharing": "all"})
    ns_only = CFG.cache.model_copy(update={"sharing": "namespace"})
    groups = CFG.cache.model_copy(update={"sharing": "groups"})
    assert shared.scope("a", {}) == shared.scope("b", {}) == ""
    assert ns_only.scope("a", {}) == "ns:a" != ns_only.scope("b", {})
    label = {groups.group_label: "vision"}
    assert groups.scope("a", label) == groups.scope("b", label) == "group:vision"
    assert groups.scope("c", {}) == "ns:c"
    assert OperatorConfig().cache.sharing == "groups"  # the default keeps unlabelled namespaces apart
    e = engine([{"gpu": H100.gpu}])
    nodes = [NodeView.from_k8s(n) for n in default_nodes()]
    a = key_inputs(e.spec, H100, nodes, CFG, cache_scope="ns:a").request_key
    b = key_inputs(e.spec, H100, nodes, CFG, cache_scope="ns:b").request_key
    assert a != b != rkey_of(e, H100)
    (j,) = plan_engine(observe(e, cache_scope="group:vision"), CFG).jobs_to_create
    cmd = j["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--cache-scope") + 1] == "group:vision"


def test_a_build_pod_the_scheduler_cannot_place_says_so() -> None:
    import dataclasses

    e = engine([{"gpu": GH200.gpu}])
    (j,) = plan_engine(observe(e), CFG).jobs_to_create
    obs = dataclasses.replace(
        observe(e, jobs=[job(j, at=NOW)]),
        unschedulable={j["metadata"]["name"]: "0/5 nodes are available: 1 Insufficient nvidia.com/gpu."},
    )
    (t,) = plan_engine(obs, CFG).status.targets
    assert (
        t.phase == "Building"
        and t.reason == "WaitingForGPU"
        and "Insufficient nvidia.com/gpu" in (t.message or "")
    )


def test_requesters_are_one_annotation_each_so_concurrent_adds_never_clobber() -> None:
    import re

    (first,) = plan_engine(observe(engine([{"gpu": H100.gpu}], namespace="team-a")), CFG).jobs_to_create
    a = next(iter(JobView.from_k8s(first).requesters()))
    b = "team-b/resnet"
    # Another engine adds itself with a merge patch of its own key: nothing of `a` is rewritten.
    first["metadata"]["annotations"].update({requester_annotation(b): b})
    assert JobView.from_k8s(first).requesters() == sorted([a, b])
    key = requester_annotation(b)
    assert key != requester_annotation(a)
    prefix, name = key.split("/")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", prefix) and len(name) <= 63


# --- keys by construction (issue 11): the operator never predicts a backend version


def test_a_builder_with_a_version_never_seen_converges_in_one_build() -> None:
    """The builder reports an engine key the operator could not have computed (any TensorRT/CUDA);
    the target is Ready from that result, and later from the store's request index alone."""
    e = engine([{"gpu": H100.gpu}])
    rk = rkey_of(e, H100)
    (j,) = plan_engine(observe(e, filed={}), CFG).jobs_to_create
    assert "--request-key" in (cmd := j["spec"]["template"]["spec"]["containers"][0]["command"])
    assert cmd[cmd.index("--request-key") + 1] == rk
    unseen = "f" * 64  # e.g. TensorRT 10.99 on CUDA 14: nothing in the operator knows it
    done = job(j, state="complete", at=NOW - 60, result=built(unseen))
    stored = {unseen: manifest_for(unseen, H100)}
    plan = plan_engine(observe(e, jobs=[done], manifests=stored, filed={}), CFG)
    (t,) = plan.status.targets
    assert (t.phase, t.engine_key, t.request_key) == ("Ready", unseen, rk) and plan.jobs_to_create == []
    # The Job is gone (GC), another namespace asks: the index the builder wrote answers, no Job.
    other = engine([{"gpu": H100.gpu}], namespace="team-z")
    plan = plan_engine(observe(other, manifests=stored, filed={rk: unseen}), CFG)
    assert plan.status.targets[0].phase == "Ready" and plan.jobs_to_create == []
    assert plan.status.targets[0].cache_hit is True


def test_an_index_entry_whose_engine_is_gone_means_build_again() -> None:
    e = engine([{"gpu": H100.gpu}])
    plan = plan_engine(observe(e, filed={rkey_of(e, H100): "9" * 64}), CFG)
    assert len(plan.jobs_to_create) == 1 and plan.status.targets[0].phase == "Building"


def test_a_new_builder_image_rebuilds_once_while_the_old_engine_serves() -> None:
    e = engine([{"gpu": H100.gpu}, {"gpu": GH200.gpu}])
    old_keys = {t: key_of(e, t) for t in (H100, GH200)}
    stored = {k: manifest_for(k, t) for t, k in old_keys.items()}
    ready = plan_engine(observe(e, manifests=stored), CFG)
    assert ready.jobs_to_create == [] and ready.status.ready_targets == "2/2"
    e1 = with_status(e, ready.status)

    cfg2 = CFG.model_copy(update={"builder_image": "ghcr.io/trtforge/builder:0.2.0"})
    p1 = plan_engine(observe(e1, manifests=stored, cfg=cfg2), cfg2)
    assert len(p1.jobs_to_create) == 2  # exactly one per target
    for t in p1.status.targets:
        assert (t.phase, t.reason) == ("Ready", "Updating")  # the old engine keeps serving
        assert t.engine_key in old_keys.values() and t.request_key == rkey_of(e, t.target())
    assert get_condition(p1.status.conditions, "Building").reason == "Updating"  # type: ignore[union-attr]
    assert {ev.reason for ev in p1.events} == {"EngineUpdating"}

    # Planning again while they run: no second Job, still serving the old engines.
    e2 = with_status(e1, p1.status)
    running = [job(j, at=NOW) for j in p1.jobs_to_create]
    p2 = plan_engine(observe(e2, jobs=running, manifests=stored, cfg=cfg2, now=NOW + 30), cfg2)
    assert p2.jobs_to_create == [] and all(t.reason == "Updating" for t in p2.status.targets)

    # The new image's engines land: Ready on them (the deployment planner then rolls them out).
    new_keys = {t: key_of(e, t, cfg2) for t in (H100, GH200)}
    stored2 = stored | {k: manifest_for(k, t, sha256="e" * 64) for t, k in new_keys.items()}
    done = [
        job(
            j,
            state="complete",
            at=NOW + 60,
            result=built(new_keys[H100 if j["metadata"]["labels"][LABEL_TARGET] == H100.name else GH200]),
        )
        for j in p1.jobs_to_create
    ]
    p3 = plan_engine(
        observe(with_status(e2, p2.status), jobs=done, manifests=stored2, cfg=cfg2, now=NOW + 90), cfg2
    )
    assert p3.jobs_to_create == []
    assert {t.engine_key for t in p3.status.targets} == set(new_keys.values())
    assert all(t.phase == "Ready" and t.reason == "Built" for t in p3.status.targets)
    assert all(t.request_key == rkey_of(e, t.target(), cfg2) for t in p3.status.targets)


def test_a_failed_update_keeps_serving_and_says_degraded() -> None:
    e = engine([{"gpu": H100.gpu}])
    stored = {key_of(e, H100): manifest_for(key_of(e, H100), H100)}
    e1 = with_status(e, plan_engine(observe(e, manifests=stored), CFG).status)
    cfg2 = CFG.model_copy(update={"builder_image": "ghcr.io/trtforge/builder:0.2.0"})
    (j,) = plan_engine(observe(e1, manifests=stored, cfg=cfg2), cfg2).jobs_to_create
    bad = job(j, state="failed", at=NOW, result={"reason": "InvalidModel", "error": "truncated"})
    p = plan_engine(observe(e1, jobs=[bad], manifests=stored, cfg=cfg2, now=NOW + 5), cfg2)
    (t,) = p.status.targets
    assert (t.phase, t.reason, t.engine_key) == ("Ready", "UpdateFailed", key_of(e, H100))
    assert get_condition(p.status.conditions, "Degraded").status == "True"  # type: ignore[union-attr]


def test_same_compute_capability_targets_share_one_build() -> None:
    nodes = [*default_nodes(), gpu_node("h200-0", "NVIDIA-H200", 8)]
    e = engine(
        [{"gpu": H100.gpu}, {"gpu": "NVIDIA-H200"}],
        builder={"hardwareCompatibility": "sameComputeCapability"},
    )
    plan = plan_engine(observe(e, nodes=nodes), CFG)
    assert len(plan.jobs_to_create) == 1
    assert {t.request_key for t in plan.status.targets} == {plan.status.targets[0].request_key}


def test_an_engine_found_in_the_store_claims_no_job_and_posts_one_event_for_its_targets() -> None:
    seed = engine([{"gpu": H100.gpu}, {"gpu": GH200.gpu}], namespace="team-a", name="seed")
    created = plan_engine(observe(seed), CFG).jobs_to_create
    stored = {key_of(seed, t): manifest_for(key_of(seed, t), t) for t in (H100, GH200)}
    done = [
        job(j, state="complete", at=NOW - 60, result=built(key_of(seed, t)))
        for j, t in zip(created, (H100, GH200), strict=True)
    ]
    other = engine([{"gpu": H100.gpu}, {"gpu": GH200.gpu}], namespace="team-a", name="other")
    plan = plan_engine(observe(other, jobs=done, manifests=stored), CFG)
    assert plan.add_requester == [] and plan.jobs_to_create == []
    assert [t.reason for t in plan.status.targets] == ["CacheHit", "CacheHit"]
    (ev,) = plan.events
    assert ev.reason == "EngineReady" and H100.name in ev.message and GH200.name in ev.message


def test_a_job_with_no_pod_yet_is_still_starting_and_one_with_a_pod_is_running() -> None:
    e = engine([{"gpu": H100.gpu}])
    first = plan_engine(observe(e), CFG)
    (j,) = first.jobs_to_create
    e = with_status(e, first.status)
    assert [t.reason for t in e.status.targets] == ["BuildStarting"]
    no_pod = job(j, at=NOW)
    no_pod["status"]["active"] = 0  # the Job controller has made no pod yet (e.g. a pod quota)
    held = plan_engine(observe(e, jobs=[no_pod], now=NOW + 5), CFG)
    assert held.status.targets == e.status.targets and held.events == []  # nothing to write
    running = plan_engine(observe(e, jobs=[job(j, at=NOW)], now=NOW + 5), CFG)
    assert [t.reason for t in running.status.targets] == ["BuildRunning"]
