"""`trtforge demo`: the whole story on the local test bed, step by step.

Cluster up → CRDs → operator → a TRTEngine built once per GPU type (full H100, arm64 GH200, a B200
MIG slice) → runtime pods serving it → a real inference with tritonclient → the same engine in another
namespace is a cache hit → a GPU fault (Xid 79) → the pod moves to a healthy H100, the engine is
rebuilt on a healthy GPU, and the service is Ready again. Then an LLM (demo_llm.py): SmolLM2
quantized by its Job, served by llama.cpp under `trtforge serve-llm`, a chat completion with openai.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

MODEL = "pvc://models/demo.onnx"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo",
        help="tell the whole trtforge story on the local test bed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--keep", action="store_true", help="leave the demo's resources and operator running")
    p.set_defaults(func=run)


class _Story:
    def __init__(self, steps: int) -> None:
        self.n, self.steps, self.t0 = 0, steps, time.monotonic()

    def step(self, title: str) -> None:
        self.n += 1
        print(
            f"\n\033[1m==> [{self.n}/{self.steps}] {title}\033[0m  (t+{time.monotonic() - self.t0:.0f}s)",
            flush=True,
        )

    @staticmethod
    def say(text: str) -> None:
        print(f"    {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one clear line, not a traceback
        print(f"\ntrtforge demo failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    import secrets
    import tempfile
    from pathlib import Path

    import numpy as np

    from trtforge_dev.demo_llm import STEPS as LLM_STEPS
    from trtforge_dev.demo_llm import llm_story
    from trtforge_dev.localdev import OperatorEnv, deployment_manifest, engine_manifest, tiny_model
    from trtforge_dev.testbed import handle
    from trtforge_dev.testbed.paths import StatePaths, default_root
    from trtforge_dev.testbed.wait import wait_for

    story = _Story(9 + LLM_STEPS)
    story.step("Local control plane with emulated GPU nodes")
    paths = StatePaths(default_root())
    tb = handle.acquire(paths)
    nodes = tb.kubectl(
        "get", "nodes", "-L", "nvidia.com/gpu.product,kubernetes.io/arch,nvidia.com/mig.config.state"
    )
    for line in nodes.stdout.splitlines():
        story.say(line)
    tag = secrets.token_hex(2)
    team_a, team_b = f"demo-team-a-{tag}", f"demo-team-b-{tag}"
    env: OperatorEnv | None = None
    victim: str | None = None
    try:
        story.step("CRDs, a build namespace with the engine store, and the operator")
        env = OperatorEnv(
            tb,
            Path(tempfile.mkdtemp(prefix="trtforge-demo-")),
            [team_a, team_b],
            cache_group=f"demo-{tag}",  # the platform team lets the two teams share engines
            faults={"suspect_node_ttl_seconds": 600},
        )
        sha = tiny_model(env.models_dir / "demo.onnx", seed=42)
        story.say(f"build namespace {env.build_ns}; store pvc://trtforge-store/ (host dir {env.store_dir})")
        story.say(f"model pvc://models/demo.onnx sha256 {sha[:16]}…")
        env.start()
        story.say(
            f"trtforge operator running (pid {env.op.proc.pid if env.op.proc else '?'}), log {env.op.log}"
        )
        story.say(f"engine broker for runtime pods at {env.config['broker']['url']}")

        story.step("A TRTEngine for three GPU types: H100, GH200 (arm64) and a B200 MIG 1g.23gb slice")
        targets = [
            {"gpu": "NVIDIA-H100-80GB-HBM3"},
            {"gpu": "NVIDIA-GH200-480GB"},
            {"gpu": "NVIDIA-B200", "mig": "1g.23gb"},
        ]
        t0 = time.monotonic()
        env.apply(engine_manifest("demo", sha, targets, model=MODEL), team_a)
        wait_for(lambda: len(env.jobs()) >= 3, timeout=60, desc="three build Jobs")  # type: ignore[union-attr]
        for j in env.jobs():
            story.say(f"build Job {j.metadata.name}  target={j.metadata.labels['trtforge.io/target']}")
        eng = env.wait_true("trtengines", team_a, "demo", timeout=300)
        ready_s = time.monotonic() - t0
        pods = {
            p.metadata.labels.get("job-name"): p
            for p in env.pods(env.build_ns, "app.kubernetes.io/component=builder")
        }
        for t in eng["status"]["targets"]:
            node = pods[t["jobName"]].spec.node_name if t["jobName"] in pods else "?"
            story.say(
                f"{t['name']:<22} built on {node:<16} key {t['engineKey'][:12]}…  "
                f"{t['buildSeconds']}s build, accuracy passed={t['accuracy']['passed']}"
            )
        story.say(f"TRTEngine Ready {eng['status']['readyTargets']} in {ready_s:.1f}s")

        story.step("An InferenceDeployment: one Deployment per GPU type, pods fetch engines from the broker")
        t1 = time.monotonic()
        env.apply(deployment_manifest("demo", "demo", replicas=len(targets)), team_a)
        infd = env.wait_true("inferencedeployments", team_a, "demo", timeout=300)
        story.say(
            f"Ready {infd['status']['ready']} in {time.monotonic() - t1:.1f}s; endpoint "
            f"{infd['status']['endpoint']}"
        )
        runtime = env.pods(team_a, "app.kubernetes.io/component=runtime")
        for p in runtime:
            story.say(f"pod {p.metadata.name:<42} on {p.spec.node_name:<16} {p.status.pod_ip}")

        story.step("A real inference with tritonclient (KServe v2 protocol)")
        import onnxruntime as ort
        import tritonclient.http as httpclient

        h100 = next(p for p in runtime if p.metadata.labels["trtforge.io/target"] == "h100-80gb-hbm3")
        x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
        c = httpclient.InferenceServerClient(f"{h100.status.pod_ip}:8000")
        inp = httpclient.InferInput("x", [1, 16], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        got = c.infer("demo", [inp]).as_numpy("y")
        ref = ort.InferenceSession(str(env.models_dir / "demo.onnx"), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )[0]
        story.say(f"pod {h100.metadata.name} answered y = {np.round(got[0][:4], 4)}…")
        story.say(f"max |y - onnxruntime| = {float(np.max(np.abs(got - ref))):.2e}")

        story.step("The same model held by another namespace of the cache group: a verify step, no build")
        jobs_before = len(env.jobs())
        env.apply(engine_manifest("demo", sha, targets, model=MODEL), team_b)
        eng_b = env.wait_true("trtengines", team_b, "demo", timeout=60)
        hits = [t["cacheHit"] for t in eng_b["status"]["targets"]]
        story.say(
            f"{team_b}/demo Ready {eng_b['status']['readyTargets']}, cacheHit={hits}, "
            f"build Jobs {jobs_before} -> {len(env.jobs())}; it proved it holds sha256 "
            f"{eng_b['status']['model']['sha256'][:16]}… with its own claim first"
        )

        story.step("GPU fault: Xid 79 (fallen off the bus) on the node serving the H100 pod")
        victim = h100.spec.node_name
        dev = tb.fault(victim, xid=79)
        story.say(f"trtforge cluster fault {victim} --xid 79 -> {dev.uuid} unhealthy")

        def recovered() -> dict[str, Any]:
            obj = env.get("inferencedeployments", team_a, "demo")  # type: ignore[union-attr]
            fs = [f for f in (obj.get("status") or {}).get("faults") or [] if f.get("node") == victim]
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"]["conditions"])
            return obj if fs and fs[-1].get("recoveredSeconds") is not None and ready else {}

        obj = wait_for(recovered, timeout=300, desc="recovery from the GPU fault")
        f = [f for f in obj["status"]["faults"] if f["node"] == victim][-1]
        story.say(
            f"fault recorded: pod {f['pod']} node {f['node']} xid {f.get('xid')} "
            f"{f.get('reason') or ''} action {f['action']}"
        )
        for p in env.pods(team_a, "trtforge.io/target=h100-80gb-hbm3"):
            if not p.metadata.deletion_timestamp:
                story.say(f"H100 pod now {p.metadata.name} on {p.spec.node_name}")
        for j in env.jobs():
            if j.metadata.labels.get("trtforge.io/build-kind") == "rebuild":
                story.say(
                    f"rebuild Job {j.metadata.name} succeeded={j.status.succeeded or 0} "
                    "(a fresh build on a healthy H100, the suspect artifact replaced)"
                )

        story.step("Recovered")
        story.say(f"InferenceDeployment Ready again {f['recoveredSeconds']}s after the fault")
        story.say(f"kubectl get infd -n {team_a}:")
        for line in tb.kubectl("get", "infd", "-n", team_a).stdout.splitlines():
            story.say(f"  {line}")

        # The LLM story's 2-rank group takes both H100 nodes whole: the ONNX deployments make way.
        tb.heal(victim)
        victim = None
        for ns in (team_a, team_b):
            tb.kubectl("delete", "inferencedeployments", "--all", "-n", ns, "--wait=true")
        wait_for(
            lambda: not env.pods(team_a, "app.kubernetes.io/component=runtime"),  # type: ignore[union-attr]
            timeout=120,
            desc="the ONNX runtime pods gone",
        )
        llm_story(tb, story, args.keep)

        story.step("Clean up" if not args.keep else "Leaving everything running (--keep)")
        if victim:
            tb.heal(victim)
            victim = None
        if args.keep:
            story.say(f"operator log: {env.op.log}; KUBECONFIG={tb.kubeconfig}")
            env = None
        print("\ndemo complete.", flush=True)
        return 0
    finally:
        if victim:
            tb.heal(victim)
        if env is not None:
            env.close()
        if not args.keep:
            handle.release(paths)
