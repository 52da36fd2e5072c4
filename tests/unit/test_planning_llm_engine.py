"""An LLM TRTEngine's plan (planning/llm_engine.py through plan_engine_pass): refused targets make no
Job at all, one quantize Job per checkpoint key, a tune Job per target once the checkpoint is in
the store, the gate's refusal with both figures, and a fixed point once Ready."""

from __future__ import annotations

from typing import Any

from trtforge_operator.api import TRTEngine, get_condition
from trtforge_operator.apply import llm_jobs
from trtforge_operator.observe.views import Capacity, EngineObserved, JobView, NodeView
from trtforge_operator.planning.engine import plan_engine_pass
from trtforge_operator.planning.engine_actions import CreateJob, CreateVerifyJob, WriteStatus

from tests.fakes import default_nodes, job
from tests.unit.test_planning_engine import CFG, NOW
from trtforge.contract.possession import PossessionRecord, source_fingerprint

SHA = "5" * 64
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"


def engine(recipe: str, targets: list[dict[str, Any]], **llm: Any) -> TRTEngine:
    return TRTEngine.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "team-a", "generation": 1, "uid": "u1"},
            "spec": {
                "llm": {"source": {"uri": "pvc://models/m.gguf", "sha256": SHA}, "recipe": recipe, **llm},
                "targets": targets,
            },
        }
    )


def observe(
    e: TRTEngine, jobs: list[dict[str, Any]] = (), verified: bool = True, **kw: Any
) -> EngineObserved:  # type: ignore[assignment]
    m = e.spec.source
    fp = source_fingerprint(m.uri, None, m.sha256)
    rec = PossessionRecord(
        namespace="team-a", fingerprint=fp, sha256=SHA, size_bytes=10, uri=m.uri, verified_at=NOW
    )
    return EngineObserved(
        namespace="team-a",
        name="chat",
        generation=1,
        spec=e.spec,
        status=e.status,
        nodes=[NodeView.from_k8s(n) for n in default_nodes()],
        jobs=[JobView.from_k8s(j) for j in jobs],
        capacity=Capacity(0, 0, 8, 4),
        now=NOW,
        uid="u1",
        possession=rec if verified else None,
        **kw,
    )


def status_of(plan: Any) -> Any:
    (w,) = plan.of(WriteStatus)
    return w.status


def created(plan: Any) -> list[dict[str, Any]]:
    return [c.job for c in plan.of(CreateJob)]


def test_recipes_the_gpu_cannot_run_are_refused_before_any_job() -> None:
    for recipe, gpu, has in (("nvfp4", H100, "9.0"), ("fp8", A100, "8.0")):
        plan = plan_engine_pass(observe(engine(recipe, [{"gpu": gpu}]), verified=False), CFG)
        assert created(plan) == [] and plan.of(CreateVerifyJob) == []
        st = status_of(plan)
        (t,) = st.targets
        assert (t.phase, t.reason) == ("Failed", "ComputeCapabilityTooLow")
        assert f"this GPU has {has}" in (t.message or "") and gpu in (t.message or "")
        stalled = get_condition(st.conditions, "Stalled")
        assert stalled is not None and stalled.status == "True" and gpu in stalled.message
        assert st.checkpoint is None


def test_weights_that_do_not_fit_are_refused_and_a_wider_mapping_fits() -> None:
    plan = plan_engine_pass(observe(engine("bf16", [{"gpu": H100}], parameters="70B")), CFG)
    (t,) = status_of(plan).targets
    assert (t.reason, created(plan)) == ("WeightsDoNotFit", [])
    wide = engine("bf16", [{"gpu": H100, "parallelism": {"tensor": 4}}], parameters="70B")
    plan = plan_engine_pass(observe(wide), CFG)
    assert [j["metadata"]["labels"]["trtforge.io/build-kind"] for j in created(plan)] == ["quantize"]


def test_one_quantize_job_for_every_target_then_a_tune_job_per_target() -> None:
    e = engine("bf16", [{"gpu": "cpu"}, {"gpu": H100}])
    plan = plan_engine_pass(observe(e), CFG)
    (q,) = created(plan)
    args = q["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[:2] == ["trtforge", "quantize"] and "--backend" in args and "llama.cpp" in args
    assert f"models/{SHA}/" in args[args.index("--source") + 1]
    st = status_of(plan)
    assert st.checkpoint.phase == "Building" and all(t.reason == "WaitingForCheckpoint" for t in st.targets)
    # the same pass again, with the Job running: no second Job (one per checkpoint key)
    assert created(plan_engine_pass(observe(e, jobs=[job(q, at=NOW - 5)]), CFG)) == []
    result = {
        "schema": "trtforge.io/quantize-result/v1",
        "checkpointKey": st.checkpoint.checkpoint_key,
        "manifestUri": "pvc://s/checkpoints/x/manifest.json",
        "backend": "llama.cpp",
        "backendVersion": "0.5.0-dev-b0-unknown",
        "recipe": "bf16",
        "quantizedType": "BF16",
        "sizeBytes": 270_000_000,
        "cacheHit": False,
        "perplexity": {"source": 19.96, "result": 19.88, "increase": -0.004, "maxIncrease": 0.01},
        "seconds": 12.0,
    }
    plan = plan_engine_pass(observe(e, jobs=[job(q, state="complete", at=NOW - 20, result=result)]), CFG)
    tunes = created(plan)
    assert [j["spec"]["template"]["spec"]["containers"][0]["command"][1] for j in tunes] == ["tune", "tune"]
    sel = {j["metadata"]["labels"]["trtforge.io/target"]: j["spec"]["template"]["spec"] for j in tunes}
    assert sel["h100-80gb-hbm3"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    ck = status_of(plan).checkpoint
    assert (ck.phase, ck.quantized_type, ck.perplexity.result) == ("Ready", "BF16", 19.88)
    tuned = [job(t, state="complete", at=NOW - 5, result=_tuned(t, ck.checkpoint_key)) for t in tunes]
    q_done = job(q, state="complete", at=NOW - 20, result=result)
    plan = plan_engine_pass(observe(e, jobs=[q_done, *tuned]), CFG)
    st = status_of(plan)
    assert created(plan) == [] and st.ready_targets == "2/2"
    assert all(t.tuning_key == "7" * 64 and t.engine_key == ck.checkpoint_key for t in st.targets)
    assert get_condition(st.conditions, "Ready").status == "True"


def _tuned(tune: dict[str, Any], ckey: str) -> dict[str, Any]:
    t = tune["metadata"]["labels"]["trtforge.io/target"]
    return {
        "schema": "trtforge.io/tune-result/v1",
        "tuningKey": "7" * 64,
        "manifestUri": "m",
        "checkpointKey": ckey,
        "backend": "llama.cpp",
        "backendVersion": "0.5.0-dev-b0-unknown",
        "gpu": "cpu" if t == "cpu" else H100,
        "mapping": "tp1pp1",
        "settings": {"threads": 2},
        "cacheHit": False,
        "seconds": 3.0,
    }


def test_a_result_past_the_gate_is_refused_with_both_figures_and_no_tune_job() -> None:
    e = engine("int4_awq", [{"gpu": "cpu"}])
    (q,) = created(plan_engine_pass(observe(e), CFG))
    failure = {
        "error": "perplexity rose past the bound",
        "reason": "ValidationFailed",
        "exitCode": 96,
        "perplexity": {"source": 19.9618, "result": 23.0856, "increase": 0.1565, "maxIncrease": 0.01},
    }
    plan = plan_engine_pass(observe(e, jobs=[job(q, state="failed", at=NOW - 20, result=failure)]), CFG)
    st = status_of(plan)
    assert created(plan) == []
    assert (st.checkpoint.phase, st.checkpoint.reason) == ("Failed", "AccuracyGateFailed")
    assert "19.9618" in st.checkpoint.message and "23.0856" in st.checkpoint.message
    assert st.targets[0].reason == "CheckpointFailed"
    stalled = get_condition(st.conditions, "Stalled")
    assert (
        stalled.status == "True" and stalled.reason == "AccuracyGateFailed" and "23.0856" in stalled.message
    )


def test_the_gates_evaluation_length_is_the_operators_setting() -> None:
    e = engine("bf16", [{"gpu": "cpu"}])
    (q,) = created(plan_engine_pass(observe(e), CFG))
    assert "--perplexity-chunks" not in q["spec"]["template"]["spec"]["containers"][0]["command"]
    short = CFG.model_copy(update={"build": CFG.build.model_copy(update={"llm_perplexity_chunks": 3})})
    (q,) = created(plan_engine_pass(observe(e), short))
    args = q["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--perplexity-chunks") + 1] == "3"


def test_quantize_and_tune_jobs_use_as_many_threads_as_the_cpus_they_request() -> None:
    e = engine("bf16", [{"gpu": "cpu"}])
    for cpu, want in (("2", "2"), ("500m", "1"), ("1.5", "2"), ("8", "8")):
        cfg = CFG.model_copy(update={"build": CFG.build.model_copy(update={"cpu": cpu})})
        (q,) = created(plan_engine_pass(observe(e), cfg))
        container = q["spec"]["template"]["spec"]["containers"][0]
        args = container["command"]
        assert args[args.index("--threads") + 1] == want, cpu
        assert container["resources"]["requests"]["cpu"] == cpu


def test_tune_jobs_bench_each_setting_as_often_as_the_operator_says() -> None:
    from trtforge.contract.gpu import GPUTarget
    from trtforge.contract.llm import Backend, Parallelism

    req = llm_jobs.TuneRequest(
        "j", "c" * 64, GPUTarget(gpu="cpu"), Parallelism(), Backend.LLAMA_CPP, {}, "ns/e"
    )
    once = CFG.model_copy(update={"build": CFG.build.model_copy(update={"llm_bench_repetitions": 1})})
    for cfg, want in ((CFG, "2"), (once, "1")):
        args = llm_jobs.tune_args(req, cfg)
        assert args[1] == "tune" and args[args.index("--repetitions") + 1] == want
    # threads benched: up to the CPUs the Job requests (build.cpu), not the node's
    small = CFG.model_copy(update={"build": CFG.build.model_copy(update={"cpu": "1"})})
    assert llm_jobs.tune_args(req, small)[llm_jobs.tune_args(req, small).index("--threads") + 1] == "1"


def test_job_names_are_build_job_names_derived_from_the_keys() -> None:
    assert llm_jobs.llm_job_name("quantize", "a" * 20) == "trtforge-build-" + "a" * 20


def test_the_verify_step_of_a_gguf_source_checks_gguf_bytes() -> None:
    plan = plan_engine_pass(observe(engine("bf16", [{"gpu": "cpu"}]), verified=False), CFG)
    (vj,) = plan.of(CreateVerifyJob)
    command = vj.job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["trtforge", "stage-model"] and command[-2:] == ["--format", "gguf"]
    assert created(plan) == [] and status_of(plan).targets[0].reason == "VerifyingModel"


def test_a_hugging_face_folder_source_is_refused_before_any_job() -> None:
    e = engine("bf16", [{"gpu": "cpu"}])
    e.spec.llm.source.format = "hf-safetensors"  # type: ignore[union-attr]
    plan = plan_engine_pass(observe(e, verified=False), CFG)
    assert plan.of(CreateVerifyJob) == [] and created(plan) == []
    assert status_of(plan).targets[0].reason == "SourceFormatUnsupported"


def test_gguf_problem_reads_the_magic(tmp_path: Any) -> None:
    from trtforge_builder.model_format import gguf_problem

    good, bad = tmp_path / "m.gguf", tmp_path / "m.onnx"
    good.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 16)
    bad.write_bytes(b"\x08\x07" + b"\x00" * 16)
    assert gguf_problem(good) is None
    assert "GGUF magic" in (gguf_problem(bad) or "")


def test_on_tensorrt_clusters_the_jobs_run_tensorrt_llm() -> None:
    """A contract check, not a run: where builds use TensorRT, quantize and tune Jobs ask the builder
    for `--backend tensorrt-llm` (ModelOpt and TensorRT-LLM), never llama.cpp."""
    from trtforge_operator.config import OperatorConfig

    cfg = OperatorConfig(
        backends={"gpu": "tensorrt", "cpu": "onnxruntime"}, build={"llama_bin_dir": "/opt/llama/bin"}
    )
    e = engine("fp8", [{"gpu": H100, "parallelism": {"tensor": 2}}])
    (q,) = created(plan_engine_pass(observe(e), cfg))
    qargs = q["spec"]["template"]["spec"]["containers"][0]["command"]
    assert qargs[qargs.index("--backend") + 1] == "tensorrt-llm" and "--llama-bin-dir" not in qargs
    ckey = status_of(plan_engine_pass(observe(e), cfg)).checkpoint.checkpoint_key
    result = {
        "schema": "trtforge.io/quantize-result/v1",
        "checkpointKey": ckey,
        "manifestUri": "m",
        "backend": "tensorrt-llm",
        "backendVersion": "1.2.0",
        "recipe": "fp8",
        "quantizedType": "FP8",
        "sizeBytes": 1,
        "cacheHit": False,
        "seconds": 1.0,
    }
    plan = plan_engine_pass(observe(e, jobs=[job(q, state="complete", at=NOW - 9, result=result)]), cfg)
    (t,) = created(plan)
    c = t["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][:2] == ["trtforge", "tune"] and c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["command"][c["command"].index("--tensor") + 1] == "2"
    assert c["command"][c["command"].index("--backend") + 1] == "tensorrt-llm"


def test_weights_past_hbm_on_gh200_are_refused_unless_the_engine_opts_in_and_then_recorded() -> None:
    from trtforge_operator.planning.llm_policies import target_identity

    from trtforge.contract.gpu import GPUTarget
    from trtforge.contract.llm import Parallelism, Recipe
    from trtforge.contract.llm.recipe import weights_need_mib

    gh200 = "NVIDIA-GH200-480GB"
    plan = plan_engine_pass(observe(engine("bf16", [{"gpu": gh200}], parameters="70B")), CFG)
    (t,) = status_of(plan).targets
    assert (t.phase, t.reason, created(plan)) == ("Failed", "WeightsDoNotFit", [])
    assert gh200 in (t.message or "") and "allowUnifiedMemoryOverflow: true" in (t.message or "")
    assert t.weights_overflow_mib is None

    e = engine("bf16", [{"gpu": gh200}], parameters="70B", allowUnifiedMemoryOverflow=True)
    obs = observe(e)
    plan = plan_engine_pass(obs, CFG)
    (t,) = status_of(plan).targets
    assert [j["metadata"]["labels"]["trtforge.io/build-kind"] for j in created(plan)] == ["quantize"]
    identity = target_identity(GPUTarget(gpu=gh200), obs.nodes)
    assert identity is not None
    need = weights_need_mib(70 * 10**9, Recipe.BF16, Parallelism())
    assert t.weights_overflow_mib == -(-(need - identity.memory_mib) // 1) > 0
    assert status_of(plan).to_wire()["targets"][0]["weightsOverflowMiB"] == t.weights_overflow_mib

    # The opt-in changes nothing on a GPU without Grace memory: still refused, and told why.
    e = engine("bf16", [{"gpu": H100}], parameters="70B", allowUnifiedMemoryOverflow=True)
    (t,) = status_of(plan_engine_pass(observe(e), CFG)).targets
    assert t.reason == "WeightsDoNotFit" and "Grace Hopper (GH200) targets only" in (t.message or "")
