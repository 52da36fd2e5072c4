"""Time to recover: from ``trtforge cluster fault`` (an Xid on the GPU under a serving pod) to the
InferenceDeployment Ready again, with and without a rebuild of the engine
(``faultPolicy.rebuildOnGPUFault`` true / false).

On the benchmark's own test bed with the operator running (as in :mod:`benchmarks.controlplane`): one
TRTEngine (SqueezeNet, one H100 target; the test bed has four H100 nodes) served by one replica.
For each policy: wait for Ready, inject Xid 79 on the pod's node, and time (a) until the fault shows
in ``status.faults``, (b) until Ready is True again with the replica on another node. The operator's
own ``recoveredSeconds`` for the fault is recorded too. The node is healed between runs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import CACHE, log, table, write_result
from benchmarks.testbed import (
    TestbedUnavailable,
    cluster,
    ensure_testbed,
    not_measured,
    operator_counters,
)

TARGET = {"gpu": "NVIDIA-H100-80GB-HBM3"}
H100_NODES = ("gpu-h100-0", "gpu-h100-1", "gpu-h100-2", "gpu-h100-3")  # the test bed's default profile
SUFFIX = time.strftime("%H%M%S")
TENANT = f"bench-recovery-{SUFFIX}"


def _infd(env: Any, name: str) -> dict[str, Any]:
    from trtforge_dev.localdev import get_custom

    obj: dict[str, Any] = get_custom(env.api, "inferencedeployments", TENANT, name)
    return obj


def _serving_nodes(env: Any) -> list[str]:
    return sorted(
        {
            p.spec.node_name
            for p in env.pods(TENANT)
            if p.spec.node_name and p.status.phase == "Running" and p.metadata.deletion_timestamp is None
        }
    )


def _rebuild_jobs(env: Any) -> int:
    """Rebuild Jobs the operator has created (its own counter)."""
    c = operator_counters(env.config["metrics_port"])
    return int(sum(v for k, v in c.items() if k.startswith("trtforge_build_jobs_created") and "rebuild" in k))


def heal_all(env: Any, root: Path, timeout: float = 90) -> None:
    """Every H100 node healthy again, with all its GPUs allocatable (the next run needs somewhere to go)."""
    from kubernetes import client

    core: Any = client.CoreV1Api(env.api)
    for node in H100_NODES:
        cluster(root, "heal", node)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        nodes = [core.read_node(n) for n in H100_NODES]
        if all(
            n.status.allocatable.get("nvidia.com/gpu") == n.status.capacity.get("nvidia.com/gpu")
            for n in nodes
        ):
            return
        time.sleep(0.5)
    raise RuntimeError(f"H100 nodes not healthy again after {timeout:.0f}s")


def one_run(env: Any, root: Path, engine: str, rebuild: bool, i: int, timeout: float) -> dict[str, Any]:
    from trtforge_dev.localdev import deployment_manifest, is_true

    name = f"rec-{'rebuild' if rebuild else 'move'}-{i}"
    env.apply(
        deployment_manifest(
            name, engine, replicas=1, faultPolicy={"rebuildOnGPUFault": rebuild, "maxRebuildsPerHour": 60}
        ),
        TENANT,
    )
    env.wait_true("inferencedeployments", TENANT, name, timeout=timeout)
    nodes = _serving_nodes(env)
    if not nodes:
        raise RuntimeError(f"{name} is Ready but no runtime pod runs")
    node = nodes[0]
    faults0 = len((_infd(env, name).get("status") or {}).get("faults") or [])
    rebuild_jobs0 = _rebuild_jobs(env)
    old_jobs = {j.metadata.name for j in env.jobs()}
    t0 = time.monotonic()
    r = cluster(root, "fault", node, "--xid", "79")
    if r.returncode != 0:
        raise RuntimeError(f"trtforge cluster fault failed: {r.stdout}{r.stderr}")
    detect_s = ready_s = recovered_s = rebuilt_s = ready_rebuilt_s = None
    record: dict[str, Any] = {}
    while time.monotonic() - t0 < timeout:
        obj = _infd(env, name)
        faults = (obj.get("status") or {}).get("faults") or []
        now = time.monotonic() - t0
        ready = is_true(obj, "Ready") and node not in _serving_nodes(env) and bool(_serving_nodes(env))
        if detect_s is None and len(faults) > faults0:
            detect_s = now
        if detect_s is not None:
            record = faults[-1]
            if ready_s is None and ready:
                ready_s = now
            if recovered_s is None and record.get("recoveredSeconds") is not None:
                recovered_s = now  # the operator marked the fault recovered
            if rebuild and rebuilt_s is None:
                done = [
                    j
                    for j in env.jobs()
                    if j.metadata.name not in old_jobs
                    and (j.metadata.labels or {}).get("trtforge.io/build-kind") == "rebuild"
                    and (j.status.succeeded or 0) >= 1
                ]
                if done:
                    rebuilt_s = now  # the rebuild Job has succeeded
            if rebuilt_s is not None and ready_rebuilt_s is None and ready:
                ready_rebuilt_s = now
            if (
                ready_s is not None
                and recovered_s is not None
                and (not rebuild or ready_rebuilt_s is not None)
            ):
                break
        time.sleep(0.2)
    rebuild_jobs = _rebuild_jobs(env) - rebuild_jobs0
    env.tb.kubectl(
        "delete", "inferencedeployment", name, "-n", TENANT, "--wait=false", timeout=60, check=False
    )
    heal_all(env, root)
    deadline = time.monotonic() + 60
    while _serving_nodes(env) and time.monotonic() < deadline:  # its pods gone before the next run
        time.sleep(0.5)
    return {
        "rebuild": rebuild,
        "node": node,
        "detect_s": round(detect_s, 2) if detect_s is not None else None,
        "ready_again_s": round(ready_s, 2) if ready_s is not None else None,
        "recovered_s": round(recovered_s, 2) if recovered_s is not None else None,
        "rebuild_job_done_s": round(rebuilt_s, 2) if rebuilt_s is not None else None,
        "ready_after_rebuild_s": round(ready_rebuilt_s, 2) if ready_rebuilt_s is not None else None,
        "rebuild_jobs": rebuild_jobs,
        "operator_recovered_s": record.get("recoveredSeconds"),
        "action": record.get("action"),
        "xid": record.get("xid"),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--root", default=str(CACHE / "cluster"))
    p.add_argument("--keep-cluster", action="store_true")
    a = p.parse_args(argv)
    root = Path(a.root)
    results: dict[str, Any] = {"runs": [], "summary": {}, "not_measured": {}}
    try:
        from trtforge_dev.localdev import MODELS_CLAIM, OperatorEnv, engine_manifest
        from trtforge_dev.testbed.handle import TestBed
        from trtforge_dev.testbed.paths import StatePaths
    except ImportError as e:
        why = f"the test bed or the operator is not in this tree: {e}"
        return not_measured("recovery", results, why, 0)
    try:
        started = ensure_testbed(root)
    except TestbedUnavailable as e:
        return not_measured("recovery", results, str(e), 1)
    env = None
    try:
        tb = TestBed(StatePaths(root))
        env = OperatorEnv(tb, CACHE / "recovery", [TENANT], build_ns=f"bench-build-rec-{SUFFIX}")
        env.start()
        from trtforge_dev.modelzoo import light_model, sha256_of

        src = light_model("squeezenet")  # 5 MB, batch fixed at 1: a rebuild really builds and validates
        shutil.copyfile(src, env.models_dir / "squeezenet.onnx")
        sha = sha256_of(src)
        model = f"pvc://{MODELS_CLAIM}/squeezenet.onnx"
        env.apply(engine_manifest("rec", sha, [TARGET], model=model, precision="fp32"), TENANT)
        env.wait_true("trtengines", TENANT, "rec", timeout=a.timeout)
        heal_all(env, root)
        for i in range(a.reps):
            for rebuild in (False, True):
                try:
                    r = one_run(env, root, "rec", rebuild, i, a.timeout)
                except Exception as e:
                    r = {"rebuild": rebuild, "error": str(e)[:500]}
                log(f"recovery run {i} rebuild={rebuild}: {r}")
                results["runs"].append(r)
    except Exception as e:
        results["not_measured"]["all"] = f"{type(e).__name__}: {str(e)[:1500]}"
        log(results["not_measured"]["all"])
    finally:
        if env is not None:
            env.close()
        if started and not a.keep_cluster:
            cluster(root, "down")
    for rebuild in (False, True):
        rs = [r for r in results["runs"] if r.get("rebuild") == rebuild]

        def med(k: str, rs: list[dict[str, Any]] = rs) -> float | None:
            v = [r[k] for r in rs if r.get(k) is not None]
            return round(statistics.median(v), 2) if v else None

        results["summary"]["rebuild" if rebuild else "no_rebuild"] = {
            "runs": len(rs),
            "detect_s_median": med("detect_s"),
            "ready_again_s_median": med("ready_again_s"),
            "marked_recovered_s_median": med("recovered_s"),
            "ready_after_rebuild_s_median": med("ready_after_rebuild_s"),
        }
    write_result("recovery", results)
    print(render(results))
    return 0


def render(results: dict[str, Any]) -> str:
    rows = [
        [
            "yes" if r.get("rebuild") else "no",
            r.get("node"),
            r.get("detect_s"),
            r.get("ready_again_s"),
            r.get("recovered_s"),
            r.get("rebuild_job_done_s"),
            r.get("ready_after_rebuild_s"),
            r.get("operator_recovered_s"),
            r.get("rebuild_jobs"),
            r.get("action"),
            r.get("error", "")[:60],
        ]
        for r in results["runs"]
    ]
    t = table(
        [
            "rebuild",
            "faulted node",
            "fault seen s",
            "Ready again s",
            "marked recovered s",
            "rebuild Job done s",
            "Ready after rebuild s",
            "operator's recoveredSeconds",
            "rebuild Jobs",
            "action",
            "error",
        ],
        rows,
    )
    nm = "".join(f"\nnot measured: {k}: {v}" for k, v in results["not_measured"].items())
    return "Time to recover from an Xid 79 under a serving pod\n" + t + nm


if __name__ == "__main__":
    sys.exit(main())
