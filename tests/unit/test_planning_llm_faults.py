"""An LLM engine after a GPU fault, and its Jobs across operator restarts (planning/llm_engine.py
through plan_engine_pass):

- a fault an InferenceDeployment recorded with a rebuild re-runs that target's tune Job (``--rebuild``,
  off the faulty node), named as the deployment waits for it; never a quantize Job; the target keeps
  serving its record meanwhile;
- every Job name derives from the observed state alone, and a pass that finds its Job (whatever
  the status says: an operator killed between the create and the status write) makes no other.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from trtforge_operator.api import FaultRecord, TRTEngine
from trtforge_operator.observe.views import ObservedFaults
from trtforge_operator.planning import faults
from trtforge_operator.planning.engine import plan_engine_pass
from trtforge_operator.planning.faults import FaultAction
from trtforge_operator.planning.rebuild import fault_rebuilds

from tests.fakes import job
from tests.unit.test_planning_engine import CFG, NOW
from tests.unit.test_planning_llm_engine import H100, _tuned, created, engine, observe, status_of

TARGET = "h100-80gb-hbm3"
QUANTIZED = {
    "schema": "trtforge.io/quantize-result/v1",
    "manifestUri": "pvc://s/checkpoints/x/manifest.json",
    "backend": "llama.cpp",
    "backendVersion": "0.5.0-dev-b0-unknown",
    "recipe": "bf16",
    "quantizedType": "BF16",
    "sizeBytes": 270_000_000,
    "cacheHit": False,
    "seconds": 12.0,
}


def kinds(plan: Any) -> list[str]:
    return [j["metadata"]["labels"]["trtforge.io/build-kind"] for j in created(plan)]


def names(plan: Any) -> list[str]:
    return sorted(j["metadata"]["name"] for j in created(plan))


def served() -> tuple[TRTEngine, list[dict[str, Any]]]:
    """An engine with a cpu and an H100 target, quantized and tuned, its status written: (it, its Jobs)."""
    e = engine("bf16", [{"gpu": "cpu"}, {"gpu": H100}])
    (q,) = created(plan_engine_pass(observe(e), CFG))
    ckey = status_of(plan_engine_pass(observe(e), CFG)).checkpoint.checkpoint_key
    q_done = job(q, state="complete", at=NOW - 60, result={**QUANTIZED, "checkpointKey": ckey})
    tunes = created(plan_engine_pass(observe(e, jobs=[q_done]), CFG))
    jobs = [q_done, *(job(t, state="complete", at=NOW - 30, result=_tuned(t, ckey)) for t in tunes)]
    st = status_of(plan_engine_pass(observe(e, jobs=jobs), CFG))
    assert st.ready_targets == "2/2"
    return e.model_copy(update={"status": st}), jobs


def fault(action: FaultAction = FaultAction.MOVED_REBUILD, node: str = "gpu-h100-0") -> FaultRecord:
    return FaultRecord(
        time=datetime.fromtimestamp(NOW - 5, UTC),
        pod="chat-h100-80gb-hbm3-abc",
        node=node,
        gpu="GPU-1",
        target=TARGET,
        xid=79,
        action=action.value,
    )


def test_a_fault_rebuild_re_runs_the_targets_tune_job_never_the_quantize_job() -> None:
    e, jobs = served()
    rec = fault()
    seen = [ObservedFaults("team-a/chat", (rec,))]
    plan = plan_engine_pass(observe(e, jobs=jobs, observed_faults=seen), CFG)
    (retune,) = created(plan)
    spec = retune["spec"]["template"]["spec"]
    command = spec["containers"][0]["command"]
    assert command[:2] == ["trtforge", "tune"] and "--rebuild" in command
    assert command[command.index("--gpu") + 1] == H100
    labels, ann = retune["metadata"]["labels"], retune["metadata"]["annotations"]
    assert (labels["trtforge.io/build-kind"], labels["trtforge.io/target"]) == ("rebuild", TARGET)
    assert ann["trtforge.io/fault"] == faults.fault_id(rec) and ann["trtforge.io/rebuild-cause"] == "fault"
    # named as the rebuild the InferenceDeployment derives from the same record and waits for
    (want,) = fault_rebuilds("team-a/chat", [rec], e.status.targets, observe(e).nodes, NOW, 300)
    assert retune["metadata"]["name"] == want.job_name
    avoid = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-h100-0"]} in (
        avoid["nodeSelectorTerms"][0]["matchFields"]
    )
    # the target serves its record meanwhile: the re-tune changes no status
    st = status_of(plan)
    assert st.ready_targets == "2/2" and [t.phase for t in st.targets] == ["Ready", "Ready"]

    # the Job is there (running, then done): no other, and the checkpoint is still its quantize Job's
    for state in ("running", "complete"):
        again = plan_engine_pass(
            observe(e, jobs=[*jobs, job(retune, state=state, at=NOW)], observed_faults=seen), CFG
        )
        assert created(again) == []
        assert status_of(again).checkpoint.job_name == jobs[0]["metadata"]["name"]
        assert status_of(again).ready_targets == "2/2"
    # recovered: nothing more is asked
    healed = [ObservedFaults("team-a/chat", (rec.model_copy(update={"recovered_seconds": 40.0}),))]
    assert created(plan_engine_pass(observe(e, jobs=jobs, observed_faults=healed), CFG)) == []


def test_no_re_tune_where_the_fault_asked_for_none_or_another_namespace_recorded_it() -> None:
    e, jobs = served()
    for action in (FaultAction.MOVED_RATE_LIMITED, FaultAction.MOVED_REBUILD_DISABLED, FaultAction.MOVED):
        seen = [ObservedFaults("team-a/chat", (fault(action),))]
        assert created(plan_engine_pass(observe(e, jobs=jobs, observed_faults=seen), CFG)) == []
    other = [ObservedFaults("team-b/chat", (fault(),))]
    assert created(plan_engine_pass(observe(e, jobs=jobs, observed_faults=other), CFG)) == []


def test_a_second_fault_waits_for_the_running_re_tune_of_its_target() -> None:
    e, jobs = served()
    first, second = fault(), fault(node="gpu-h100-1").model_copy(update={"pod": "chat-h100-80gb-hbm3-def"})
    (retune,) = created(
        plan_engine_pass(
            observe(e, jobs=jobs, observed_faults=[ObservedFaults("team-a/chat", (first,))]), CFG
        )
    )
    both = [ObservedFaults("team-a/chat", (first, second))]
    running = [*jobs, job(retune, state="running", at=NOW)]
    assert created(plan_engine_pass(observe(e, jobs=running, observed_faults=both), CFG)) == []
    done = [*jobs, job(retune, state="complete", at=NOW)]
    (next_one,) = created(plan_engine_pass(observe(e, jobs=done, observed_faults=both), CFG))
    assert next_one["metadata"]["annotations"]["trtforge.io/fault"] == faults.fault_id(second)


def test_every_job_name_derives_from_the_observed_state_and_a_found_job_is_never_made_twice() -> None:
    """The operator killed at any line: before a create (the next pass derives the same name), after
    it and before the status write (the next pass finds the Job with the old status and makes none),
    or after both. Pure: the same observed state always plans the same Jobs."""
    e = engine("bf16", [{"gpu": "cpu"}, {"gpu": H100}])
    first = plan_engine_pass(observe(e), CFG)
    assert names(first) == names(plan_engine_pass(observe(e), CFG)) and kinds(first) == ["quantize"]
    (q,) = created(first)
    # created, status never written (killed in between): found, not made again, its status taken up
    for j in (q, job(q, at=NOW - 1)):  # as created (no status yet), then running
        plan = plan_engine_pass(observe(e, jobs=[j]), CFG)
        assert created(plan) == [] and status_of(plan).checkpoint.job_name == q["metadata"]["name"]
    ckey = status_of(first).checkpoint.checkpoint_key
    q_done = job(q, state="complete", at=NOW - 60, result={**QUANTIZED, "checkpointKey": ckey})
    tunes = plan_engine_pass(observe(e, jobs=[q_done]), CFG)
    assert kinds(tunes) == ["tune", "tune"]
    assert names(tunes) == names(plan_engine_pass(observe(e, jobs=[q_done]), CFG))
    # killed after the first tune Job's create: the next pass makes only the other one, same name
    t1, t2 = sorted(created(tunes), key=lambda j: j["metadata"]["name"])
    rest = plan_engine_pass(observe(e, jobs=[q_done, job(t1, at=NOW)]), CFG)
    assert names(rest) == [t2["metadata"]["name"]]
    # both there: nothing new; and a status written by an earlier pass changes no name
    both = [q_done, job(t1, at=NOW), job(t2, at=NOW)]
    assert created(plan_engine_pass(observe(e, jobs=both), CFG)) == []
    written = e.model_copy(update={"status": status_of(plan_engine_pass(observe(e, jobs=both), CFG))})
    assert created(plan_engine_pass(observe(written, jobs=both), CFG)) == []
