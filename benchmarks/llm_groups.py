"""A 2-rank LLM group against one rank on the test bed, in the same run, and the time from a rank's
fault to the group's first token again (docs/llm.md §"Groups").

One operator, one tenant namespace, the SmolLM2 GGUF as two TRTEngines: ``smollm2`` for the ``cpu``
target (one pod) and ``smollm2-tp16`` for H100 with ``parallelism: {tensor: 16}`` (two of the test
bed's 8-GPU H100 nodes: a group of two rank pods). Two InferenceDeployments serve them with llama.cpp:
``one`` and ``grp`` (group ``grp-g0``: rank 1 ``ggml-rpc-server``, rank 0 ``llama-server --rpc``).
The test bed has no kube-proxy: clients go to the pod IP and ``openai`` port from each Service's
EndpointSlices (the group's Service selects its leader only while the group is whole).

1. **Group against one rank**: aiperf (:func:`benchmarks.llm.aiperf_cmd`) at each concurrency,
   alternating which side goes first, the 1-minute load average recorded with every point.
2. **Rank fault to first token**: rank 1's ``ggml-rpc-server`` is killed (SIGKILL); the times after
   the kill when the leader left the Service, both rank pods were new, the group was whole and Ready,
   its leader was back in the Service, and the ``openai`` client streamed its first token.

On the test bed both ranks are processes of the same 2-CPU machine, talking llama.cpp's RPC backend
over loopback: no TensorRT-LLM, no GPU. The group is expected to be slower than one rank here: the
figure is the cost of the rank hop, not a multi-GPU speed-up.

    python -m benchmarks.llm_groups [--concurrency 1 4] [--requests 8] [--faults 1]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import CACHE, log, table, write_result
from benchmarks.llm import AIPERF, Point, run_aiperf, tokenizer_dir
from benchmarks.llm_deployment import first_token, openai_address, ratios, testbed

NAME = "llm_groups"
H100 = "NVIDIA-H100-80GB-HBM3"
RANK = "trtforge.io/rank"
RANK_PORT = 50052
ONE, GRP = "one", "grp"
SIDES = {ONE: "one rank", GRP: "2-rank group"}
# The fault's milestones, in the order they must happen.
MILESTONES = (
    ("leader_out", "leader out of the Service"),
    ("recreated", "both rank pods new"),
    ("whole", "group whole and Ready"),
    ("endpoint", "leader back in the Service"),
    ("first_token", "first streamed token"),
)


def fault_timeline(marks: dict[str, float], t_kill: float, load: dict[str, float]) -> list[dict[str, Any]]:
    """Each milestone's time after the kill and after the one before it, with the 1-minute load
    average when it was seen; raises ValueError if one is missing or seen before the one it follows."""
    out: list[dict[str, Any]] = []
    prev = t_kill
    for key, what in MILESTONES:
        if key not in marks:
            raise ValueError(f"the fault's timeline has no {key!r} ({what}): {sorted(marks)}")
        if marks[key] < prev:
            raise ValueError(f"{key!r} ({what}) was seen before the milestone it follows")
        out.append(
            {
                "milestone": key,
                "after_kill_s": round(marks[key] - t_kill, 2),
                "step_s": round(marks[key] - prev, 2),
                "loadavg_1m": load.get(key),
            }
        )
        prev = marks[key]
    return out


def _pods(env: Any, ns: str) -> list[Any]:
    return [p for p in env.pods(ns, f"trtforge.io/group={GRP}-g0") if not p.metadata.deletion_timestamp]


def _whole(env: Any, ns: str) -> bool:
    from trtforge_dev.localdev import condition

    obj = env.get("inferencedeployments", ns, GRP)
    groups, ready = condition(obj, "Groups"), condition(obj, "Ready")
    return bool(groups and groups["status"] == "True" and ready and ready["status"] == "True")


def kill_rank_1(env: Any, ns: str, timeout: float) -> dict[str, Any]:
    """SIGKILL to rank 1's `ggml-rpc-server`, then each milestone as first seen (polled every 0.25 s)."""
    from kubernetes.client.rest import ApiException
    from trtforge_dev.testbed import llama

    pods = _pods(env, ns)
    before = {p.metadata.uid for p in pods}
    worker = next(p for p in pods if p.metadata.labels.get(RANK) == "1")
    pid = llama.rpc_server_pid(worker.status.pod_ip, RANK_PORT)
    marks: dict[str, float] = {}
    load: dict[str, float] = {}

    def seen(key: str) -> None:
        marks[key] = time.monotonic()
        load[key] = round(os.getloadavg()[0], 2)
        log(f"  {key} at {marks[key] - t_kill:.2f} s")

    checks: list[tuple[str, Callable[[], bool]]] = [
        ("leader_out", lambda: openai_address(env.api, ns, GRP) is None),
        ("recreated", lambda: len(now := _pods(env, ns)) == 2 and not {p.metadata.uid for p in now} & before),
        ("whole", lambda: _whole(env, ns)),
        ("endpoint", lambda: openai_address(env.api, ns, GRP) is not None),
    ]
    load0 = round(os.getloadavg()[0], 2)
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    for key, check in checks:
        while True:
            if time.monotonic() - t_kill > timeout:
                raise TimeoutError(f"no {key!r} {timeout:.0f} s after the kill: {sorted(marks)}")
            try:
                if check():
                    break
            except ApiException:
                pass
            time.sleep(0.25)
        seen(key)
    addr = openai_address(env.api, ns, GRP)
    assert addr is not None
    marks["first_token"] = first_token(*addr, timeout=120, model=GRP)
    load["first_token"] = round(os.getloadavg()[0], 2)
    return {"loadavg_1m_at_kill": load0, "timeline": fault_timeline(marks, t_kill, load)}


def measure(
    a: argparse.Namespace, addrs: dict[str, tuple[str, int]], work: Path, isl: int, osl: int
) -> list[dict[str, Any]]:
    """aiperf at each concurrency against both Services' endpoints, alternating which goes first."""
    from trtforge_dev.testbed import smollm2

    python = AIPERF.ensure()
    tok = tokenizer_dir(smollm2.smollm2_gguf(), python)
    rows: list[dict[str, Any]] = []
    for c in a.concurrency:
        n = a.requests or max(8, 2 * c)
        for side in [ONE, GRP] if c % 2 else [GRP, ONE]:
            host, port = addrs[side]
            load0 = round(os.getloadavg()[0], 2)
            t0 = time.monotonic()
            log(f"aiperf {side} c={c} n={n}")
            point = Point(f"http://{host}:{port}", side, c, n, isl, osl)
            figures = run_aiperf(python, tok, point, a.client_cpus, work / f"aiperf-{side}-c{c}")
            row = {"side": side, "concurrency": c, "requests": n, **figures}
            row["wall_s"] = round(time.monotonic() - t0, 2)
            row["loadavg_1m_before"] = load0
            row["loadavg_1m"] = round(os.getloadavg()[0], 2)
            rows.append(row)
            log(json.dumps(row))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--requests", type=int, default=None, help="requests per point (default: max(8, 2c))")
    ap.add_argument("--input-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--faults", type=int, default=1, help="rank faults to time, one after another")
    ap.add_argument("--client-cpus", default="1", help="taskset list for aiperf")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for each wait")
    ap.add_argument("--root", type=Path, default=CACHE / "cluster", help="the test bed's state directory")
    ap.add_argument("--name", default=NAME, help="the results file's name")
    a = ap.parse_args(argv)
    import yaml
    from trtforge_dev.localdev import OperatorEnv, deployment_manifest
    from trtforge_dev.testbed import llama, smollm2
    from trtforge_dev.testbed.wait import wait_for

    work = CACHE / NAME
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    AIPERF.ensure()
    load0 = round(os.getloadavg()[0], 2)
    args = argv if argv is not None else sys.argv[1:]
    ns = f"bench-grp-{secrets.token_hex(2)}"
    path = (
        f"{llama.llama_bin('llama-server').parent}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    )
    pod_env = {"env": [{"name": "PATH", "value": path}]}
    faults: list[dict[str, Any]] = []
    with testbed(a.root) as tb:
        env = OperatorEnv(
            tb,
            work,
            [ns],
            build_ns=f"{ns}-build",
            build={"llama_bin_dir": str(llama.bin_dir()), "cpu": "1", "memory": "2Gi",
                   "llm_perplexity_chunks": 3, "llm_bench_repetitions": 1},
        )  # fmt: skip
        cfg = yaml.safe_load(env.config_path.read_text())
        cfg["runtime_store_uri"] = str(env.store_dir)  # LLM pods read the store themselves
        env.config_path.write_text(yaml.safe_dump(cfg))
        try:
            env.start()
            gguf = smollm2.smollm2_gguf()
            shutil.copyfile(gguf, env.models_dir / gguf.name)
            env.apply(smollm2.engine_manifest("smollm2"), ns)
            tp16 = [{"gpu": H100, "parallelism": {"tensor": 16}}]
            env.apply(smollm2.engine_manifest("smollm2-tp16", targets=tp16), ns)
            for eng in ("smollm2", "smollm2-tp16"):
                env.wait_true("trtengines", ns, eng, timeout=a.timeout)
            env.apply(deployment_manifest(ONE, "smollm2", llm={"server": "llama.cpp"}, runtime=pod_env), ns)
            env.apply(
                deployment_manifest(
                    GRP, "smollm2-tp16", llm={"server": "llama.cpp"}, runtime=pod_env, targets=[{"gpu": H100}]
                ),
                ns,
            )
            addrs = {
                s: wait_for(
                    lambda s=s: openai_address(env.api, ns, s), timeout=a.timeout, desc=f"{s}'s endpoint"
                )
                for s in (ONE, GRP)
            }
            for s, (ip, port) in addrs.items():
                first_token(ip, port, timeout=120, model=s)  # both answer before anything is timed
            nodes = {p.metadata.labels.get(RANK): p.spec.node_name for p in _pods(env, ns)}
            log(f"endpoints {addrs}, group ranks on {nodes}")
            results = measure(a, addrs, work, a.input_tokens, a.output_tokens)
            for i in range(a.faults):
                log(f"fault {i + 1}: kill rank 1's ggml-rpc-server")
                faults.append(kill_rank_1(env, ns, a.timeout))
        finally:
            env.close()
    p = write_result(
        a.name,
        {
            "config": {
                "gguf": gguf.name, "input_tokens": a.input_tokens, "output_tokens": a.output_tokens,
                "client_cpus": a.client_cpus, "group_ranks_on": nodes, "aiperf": AIPERF.version("aiperf"),
                "loadavg_1m_at_start": load0, "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
                "command": " ".join([f"python -m benchmarks.{NAME}", *args]),
            },
            "results": results,
            "ratios": ratios(results, a.concurrency, over=GRP, base=ONE),
            "faults": faults,
        },
    )  # fmt: skip
    print(render(json.loads(p.read_text())))
    return 0


KEYS = ("output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p90", "itl_ms_p50", "loadavg_1m")


def render(res: dict[str, Any]) -> str:
    """The results block of docs/benchmarks.md: group against one rank (a row per concurrency, each
    cell one rank / group), then each fault's timeline."""
    cfg = res["config"]
    rs = res["ratios"]
    cs = ", ".join(str(r["concurrency"]) for r in rs)
    tps = ", ".join(f"{r['tokens_per_s_ratio']}x" for r in rs)
    ttft = ", ".join(f"{r['ttft_p50_ratio']}x" for r in rs)
    labels = dict(MILESTONES)
    faults = " ".join(
        f"Fault {i}: rank 1's `ggml-rpc-server` killed (load {f['loadavg_1m_at_kill']}); after the kill: "
        + ", ".join(f"{labels[m['milestone']]} {m['after_kill_s']} s" for m in f["timeline"])
        + f" (load {f['timeline'][-1]['loadavg_1m']})."
        for i, f in enumerate(res["faults"], 1)
    )
    ranks = ", ".join(f"rank {r} on {n}" for r, n in sorted(cfg["group_ranks_on"].items()))
    prose = (
        f"SmolLM2 as tensor 16 on H100 (group `grp-g0`, {ranks}: rank 1 `ggml-rpc-server`, rank 0 "
        f"`llama-server --rpc`) against one pod on the `cpu` target, both served by InferenceDeployments. "
        f"Both ranks and the one-rank pod share the test bed's CPUs (llama.cpp's RPC backend over "
        f"loopback; no TensorRT-LLM, no GPU): the group's figures are the cost of the rank hop, not a "
        f"multi-GPU speed-up. {cfg['input_tokens']} prompt and {cfg['output_tokens']} output tokens, aiperf "
        f"on CPU {cfg['client_cpus']}; 1-min load average {cfg['loadavg_1m_at_start']} at the start, "
        f"{cfg['loadavg_1m_at_end']} at the end. Group over one rank: tokens/s {tps} and TTFT p50 {ttft} "
        f"at c = {cs}. {faults}"
    )
    rows = []
    for c in dict.fromkeys(r["concurrency"] for r in res["results"]):
        one, grp = (
            next(r for r in res["results"] if r["concurrency"] == c and r["side"] == s) for s in (ONE, GRP)
        )
        rows.append([c, *(f"{_num(one[k])} / {_num(grp[k])}" for k in KEYS)])
    head = ["c", "tokens/s one / group", "TTFT p50 ms", "TTFT p90 ms", "ITL p50 ms", "load 1m"]
    return "\n".join([prose.strip(), table(head, rows)])


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"


if __name__ == "__main__":
    sys.exit(main())
