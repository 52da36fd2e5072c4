"""An LLM through its InferenceDeployment on the test bed: from ``kubectl apply`` to the first token,
and aiperf's TTFT, inter-token latency and tokens/s through the deployment against the same
llama.cpp server started directly.

The flow is the demo's (:mod:`trtforge_dev.demo_llm`): a TRTEngine naming the SmolLM2 GGUF (recipe
bf16, quantized and tuned by its Jobs) and an InferenceDeployment serving it with llama.cpp under
``trtforge serve-llm`` on the CPU node. The test bed has no kube-proxy, so every client goes to the
pod IP and ``openai`` port from the Service's EndpointSlices.

1. **Apply to first token**, with the test bed's own ``kubectl apply`` of both objects as the start
   and the first streamed token from the ``openai`` client as the end: *cold* (empty store: quantize
   and tune Jobs, then the pod), *checkpoint in the store* (the same digest and recipe in a second
   namespace of the same cache group: no Job runs) and *redeploy* (the InferenceDeployment deleted and
   applied again beside its Ready TRTEngine).
2. **Through the deployment against direct**: the pod's own ``llama-server`` command line, read from
   ``/proc``, is started again on the host with its host and port changed and the model path pointing
   at a copy of the GGUF the pod verified (the same bytes: same threads, context and slots as the
   pod, whatever the tuning record set). The two llama-servers alone are pinned to ``--server-cpus``;
   everything else of ours (the test bed from before its Jobs run, the operator, the pod's
   supervisor) to ``--support-cpus``; aiperf to ``--client-cpus``. ``--rounds`` passes over the
   concurrencies, the first side swapping each time (two rounds: ABBA); the ratios are of the medians,
   and each point also records llama-server's own decode time per token (its ``/metrics``), its CPU
   seconds, the supervisor's and aiperf's, and the load average, so a gap can be told apart from a
   server that got less of its core.

On the test bed this is llama.cpp, not TensorRT-LLM.

    python -m benchmarks.llm_deployment [--quick] [--concurrency 1 4 16] [--rounds 4]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    CACHE,
    CLK_TCK,
    cpu_ticks,
    descendants,
    free_ports,
    http_get,
    log,
    start,
    stop,
    table,
    taskset,
    tree_cpu_seconds,
    wait_http_ok,
    write_result,
)
from benchmarks.llm import AIPERF, Point, run_aiperf, tokenizer_dir

NAME = "llm_deployment"
INFD = "chat"
ENGINE = "smollm2"

# llama-server's options whose values the direct copy replaces.
_MODEL_FLAGS = ("-m", "--model")
_HOST_FLAGS = ("--host",)
_PORT_FLAGS = ("--port",)
_SETTINGS = {
    "threads": ("-t", "--threads"),
    "threads_batch": ("-tb", "--threads-batch"),
    "ctx": ("-c", "--ctx-size"),
    "parallel": ("-np", "--parallel"),
    "batch": ("-b", "--batch-size"),
    "ubatch": ("-ub", "--ubatch-size"),
}


def flag_value(argv: Sequence[str], flags: Sequence[str]) -> str | None:
    """The value of the last of `flags` in `argv` (``-t 2`` or ``--threads=2``), or None."""
    found = None
    for i, a in enumerate(argv):
        if a in flags and i + 1 < len(argv):
            found = argv[i + 1]
        elif "=" in a and a.split("=", 1)[0] in flags:
            found = a.split("=", 1)[1]
    return found


def server_settings(argv: Sequence[str]) -> dict[str, int | None]:
    """Threads, batch threads, context, slots and batch sizes of a llama-server command line."""
    out: dict[str, int | None] = {}
    for name, flags in _SETTINGS.items():
        v = flag_value(argv, flags)
        out[name] = int(v) if v is not None else None
    return out


def direct_argv(pod_argv: Sequence[str], binary: str, model: Path, host: str, port: int) -> list[str]:
    """The pod's llama-server command line with its executable, model path, host and port replaced and
    every other argument kept as it is; raises ValueError if it names no model."""
    if flag_value(pod_argv, _MODEL_FLAGS) is None:
        raise ValueError(f"the pod's server command names no model (-m/--model): {list(pod_argv)}")
    repl = {**dict.fromkeys(_MODEL_FLAGS, str(model)), **dict.fromkeys(_HOST_FLAGS, host)}
    repl.update(dict.fromkeys(_PORT_FLAGS, str(port)))
    out = [binary]
    args = list(pod_argv[1:])
    i = 0
    seen_host = seen_port = False
    while i < len(args):
        a = args[i]
        key = a.split("=", 1)[0] if a.startswith("--") and "=" in a else a
        if key in repl and (key != a or i + 1 < len(args)):
            seen_host |= key in _HOST_FLAGS
            seen_port |= key in _PORT_FLAGS
            out += [key, repl[key]]
            i += 1 if key != a else 2
            continue
        out.append(a)
        i += 1
    if not seen_host:
        out += ["--host", host]
    if not seen_port:
        out += ["--port", str(port)]
    return out


# --- the pod's processes --------------------------------------------------------------------
def pod_pids(pod_ip: str) -> list[int]:
    """Host pids of the test bed's pod with this IP (its processes carry POD_IP in their environment)."""
    want = f"POD_IP={pod_ip}".encode()
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if want in (d / "environ").read_bytes().split(b"\0"):
                pids.append(int(d.name))
        except OSError:
            continue
    return sorted(pids)


def cmdline(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def pin(pids: Sequence[int], cpus: str) -> None:
    """Every thread of every pid onto `cpus` (their children started later inherit it); a process that
    has exited meanwhile is passed over."""
    for pid in pids:
        r = subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True, text=True)
        if r.returncode != 0 and Path(f"/proc/{pid}").exists():
            raise RuntimeError(f"taskset -c {cpus} of pid {pid} failed: {r.stderr.strip()}")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- the test bed -----------------------------------------------------------------------------
class Bed:
    """An operator on the test bed with two tenant namespaces of one cache group."""

    def __init__(self, tb: Any, work: Path) -> None:
        import yaml
        from trtforge_dev.localdev import OperatorEnv
        from trtforge_dev.testbed import llama

        tag = secrets.token_hex(2)
        self.cold_ns, self.warm_ns = f"bench-llm-{tag}-a", f"bench-llm-{tag}-b"
        self.env = OperatorEnv(
            tb,
            work,
            [self.cold_ns, self.warm_ns],
            build_ns=f"bench-llm-build-{tag}",
            cache_group=f"bench-llm-{tag}",
            build={"llama_bin_dir": str(llama.bin_dir()), "cpu": "1", "memory": "2Gi"},
        )
        cfg = yaml.safe_load(self.env.config_path.read_text())
        # LLM runtime pods read the store themselves (the broker serves ONNX engines only).
        cfg["runtime_store_uri"] = str(self.env.store_dir)
        self.env.config_path.write_text(yaml.safe_dump(cfg))

    def manifests(self, with_engine: bool) -> str:
        import yaml
        from trtforge_dev.localdev import deployment_manifest
        from trtforge_dev.testbed import llama, smollm2

        path = f"{llama.llama_bin('llama-server').parent}:{Path(sys.executable).parent}:/usr/bin:/bin"
        infd = deployment_manifest(
            INFD, ENGINE, llm={"server": "llama.cpp"}, runtime={"env": [{"name": "PATH", "value": path}]}
        )
        docs = [smollm2.engine_manifest(ENGINE), infd] if with_engine else [infd]
        return yaml.safe_dump_all(docs)

    def openai_address(self, ns: str) -> tuple[str, int] | None:
        return openai_address(self.env.api, ns, INFD)

    def apply_to_first_token(self, ns: str, with_engine: bool, timeout: float) -> dict[str, Any]:
        """`kubectl apply` of the manifests, then the first streamed token through the Service's
        endpoint; the times (s after the apply began) when each step was first seen."""
        from kubernetes.client.rest import ApiException
        from trtforge_dev.localdev import is_true

        text = self.manifests(with_engine)
        t0 = time.monotonic()
        self.env.tb.kubectl("apply", "-n", ns, "-f", "-", input=text)
        out: dict[str, Any] = {"kubectl_apply_s": round(time.monotonic() - t0, 2)}
        deadline = t0 + timeout
        addr = None
        while addr is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ns}: no ready endpoint {timeout:.0f}s after the apply: {out}")
            try:
                if "engine_ready_s" not in out and is_true(self.env.get("trtengines", ns, ENGINE), "Ready"):
                    out["engine_ready_s"] = round(time.monotonic() - t0, 2)
                addr = self.openai_address(ns)
            except ApiException:
                pass
            if addr is None:
                time.sleep(0.25)
        out["endpoint_ready_s"] = round(time.monotonic() - t0, 2)
        out["first_token_s"] = round(first_token(*addr, timeout=120) - t0, 2)
        out["store_jobs"] = sorted({j.metadata.name for j in self.env.jobs()})
        return out

    def delete_deployment(self, ns: str) -> None:
        from trtforge_dev.localdev import delete_with_cleanup
        from trtforge_dev.testbed.wait import wait_for

        delete_with_cleanup(self.env.api, ns, "inferencedeployments", INFD)
        wait_for(lambda: not self.env.pods(ns, "app.kubernetes.io/component=runtime"), timeout=180,
                 desc=f"{ns}'s runtime pods gone")  # fmt: skip


def openai_address(api: Any, ns: str, service: str) -> tuple[str, int] | None:
    """A ready endpoint of the Service's `openai` port, from its EndpointSlices."""
    from trtforge_dev.testbed.endpoints import openai_addresses

    return next(iter(openai_addresses(api, ns, service)), None)


def first_token(ip: str, port: int, timeout: float, model: str = INFD) -> float:
    """monotonic() when the first streamed content arrives from the `openai` client."""
    from openai import OpenAI

    chat = OpenAI(base_url=f"http://{ip}:{port}/v1", api_key="none", max_retries=0, timeout=timeout)
    stream = chat.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        stream=True,
    )
    try:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                return time.monotonic()
    finally:
        stream.close()
    raise RuntimeError(f"{ip}:{port} streamed no token")


# --- through the deployment against direct ----------------------------------------------------
SIDES = ("direct", "deployment")


def side_order(round_: int, index: int) -> tuple[str, ...]:
    """Which side goes first at the `index`-th concurrency of round `round_`: the first swaps from one
    concurrency to the next and from one round to the next, so two rounds make ABBA at every
    concurrency (a drift in the machine's load falls on both sides alike)."""
    return SIDES if (round_ + index) % 2 == 0 else SIDES[::-1]


def prompt_seed(round_: int, index: int) -> int:
    """aiperf's prompt seed at the `index`-th concurrency of round `round_`: the same for both sides,
    another at every point, so no point meets prompts its server has answered before (llama-server
    reuses a slot's cached prompt: a second pass over the same prompts cut the prompt time tenfold)."""
    return 1 + 1000 * round_ + index


def pod_server(ip: str) -> tuple[list[int], int, int, list[str]]:
    """The pod's pids, its supervisor's pid (`trtforge serve-llm`), its llama-server's pid and
    command line."""
    pids = pod_pids(ip)
    servers = [p for p in pids if Path(cmdline(p)[0]).name == "llama-server"]
    supervisors = [p for p in pids if "serve-llm" in cmdline(p)]
    if not servers or not supervisors:
        raise RuntimeError(f"no serve-llm and llama-server among the processes of the pod at {ip}: {pids}")
    return pids, supervisors[0], servers[0], cmdline(servers[0])


# llama-server's own counters (``--metrics``), read before and after each point.
_COUNTERS = {
    "tokens": "llamacpp:tokens_predicted_total",
    "decode_s": "llamacpp:tokens_predicted_seconds_total",
    "prompt_s": "llamacpp:prompt_seconds_total",
    "decodes": "llamacpp:n_decode_total",
}


def parse_counters(text: str) -> dict[str, float]:
    """The counters of :data:`_COUNTERS` in a Prometheus exposition (absent ones left out)."""
    want = {v: k for k, v in _COUNTERS.items()}
    out: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in want:
            out[want[parts[0]]] = float(parts[1])
    return out


def server_work(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What the server itself did in one point: its decode time per generated token (ms), its prompt
    time (s) and how many batches it decoded; None where a counter is missing."""
    d = {k: after[k] - before[k] for k in _COUNTERS if k in before and k in after}
    tokens = d.get("tokens")
    per_token = 1000 * d["decode_s"] / tokens if tokens and "decode_s" in d else None
    return {
        "server_ms_per_token": round(per_token, 2) if per_token is not None else None,
        "server_prompt_s": round(d["prompt_s"], 2) if "prompt_s" in d else None,
        "server_decodes": int(d["decodes"]) if "decodes" in d else None,
    }


def read_counters(host: str, port: int) -> dict[str, float]:
    status, body = http_get(f"http://{host}:{port}/metrics", timeout=10.0)
    return parse_counters(body.decode(errors="replace")) if status == 200 else {}


def process_facts(pid: int) -> dict[str, Any]:
    """What could set two identical servers apart: niceness, scheduling policy, CPUs, cgroup and where
    its stdout goes."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return {
        "nice": int(stat[16]),
        "policy": int(stat[38]),
        "cpus": status.get("Cpus_allowed_list", "").strip(),
        "threads": int(status.get("Threads", "0").strip()),
        "cgroup": Path(f"/proc/{pid}/cgroup").read_text().strip(),
        "stdout": os.readlink(f"/proc/{pid}/fd/1"),
    }


def support_pids(bed: Bed, keep: Sequence[int]) -> list[int]:
    """The test bed's processes (control plane, emulated kubelets, the pods they run), the operator and
    this process, less the pids in `keep` (the two llama-servers)."""
    from trtforge_dev.testbed import procs

    pids = set(procs.marked_pids(bed.env.tb.root)) | set(descendants(os.getpid()))
    return sorted(p for p in pids if p not in keep)


def compare(
    a: argparse.Namespace, bed: Bed, ip: str, port: int, work: Path, isl: int, osl: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """aiperf at each concurrency, `a.rounds` times, the sides alternating (:func:`side_order`)."""
    from trtforge_dev.testbed import llama, smollm2

    pids, supervisor, pod_llama, argv = pod_server(ip)
    server = Path(argv[0])
    pod_model = flag_value(argv, _MODEL_FLAGS)
    assert pod_model is not None
    model = work / "served.gguf"  # the bytes the pod verified, through its own mount namespace
    shutil.copyfile(f"/proc/{pod_llama}/root{pod_model}", model)
    direct_port = free_ports(1)[0]
    binary = str(server if server.is_absolute() else llama.llama_bin("llama-server"))
    cmd = direct_argv(argv, binary, model, "127.0.0.1", direct_port)
    log(f"pod server: {' '.join(argv)}")
    direct = start(taskset(a.server_cpus, cmd), work / "direct.log")
    pin([pod_llama], a.server_cpus)
    if a.support_cpus:
        others = support_pids(bed, [pod_llama, direct.pid])
        pin(others, a.support_cpus)
    else:
        others = [p for p in pids if p != pod_llama]
        pin(others, a.server_cpus)
    python = AIPERF.ensure()
    tok = tokenizer_dir(smollm2.smollm2_gguf(), python)
    results: list[dict[str, Any]] = []
    try:
        wait_http_ok(f"http://127.0.0.1:{direct_port}/health", 300, direct, interval=0.2)
        sides = {"direct": (direct.pid, "127.0.0.1", direct_port), "deployment": (pod_llama, ip, port)}
        config = {
            "pod_server_argv": argv, "direct_argv": cmd, "settings": server_settings(argv),
            "gguf_sha256": sha256_of(model), "pinned_support_pids": len(others),
            "server_processes": {s: process_facts(pid) for s, (pid, _, _) in sides.items()},
            "supervisor_process": process_facts(supervisor),
            "hpas": hpa_count(bed),
        }  # fmt: skip
        log(f"servers: {json.dumps(config['server_processes'])}")
        for rnd in range(a.rounds):
            for i, c in enumerate(a.concurrency):
                n = a.requests or max(8 if a.quick else 16, 4 * c)
                for side in side_order(rnd, i):
                    pid, host, p = sides[side]
                    cpu0, sup0, cli0 = tree_cpu_seconds(pid), _own_cpu_seconds(supervisor), _children_cpu()
                    wait0 = run_queue_wait_s(pid)
                    before = read_counters(host, p)
                    t0 = time.monotonic()
                    log(f"round {rnd} aiperf {side} c={c} n={n}")
                    point = Point(f"http://{host}:{p}", INFD, c, n, isl, osl, seed=prompt_seed(rnd, i))
                    stats = run_aiperf(python, tok, point, a.client_cpus, work / f"aiperf-{side}-c{c}-r{rnd}")
                    row = {"round": rnd, "side": side, "concurrency": c, "requests": n, **stats}
                    row["wall_s"] = round(time.monotonic() - t0, 2)
                    row["server_cpu_s"] = round(tree_cpu_seconds(pid) - cpu0, 2)
                    row["supervisor_cpu_s"] = round(_own_cpu_seconds(supervisor) - sup0, 2)
                    row["client_cpu_s"] = round(_children_cpu() - cli0, 2)
                    # How long its server waited for its core while others ran there.
                    row["server_wait_s"] = round(run_queue_wait_s(pid) - wait0, 2)
                    row.update(server_work(before, read_counters(host, p)))
                    row["loadavg_1m"] = round(os.getloadavg()[0], 2)
                    results.append(row)
                    log(json.dumps(row))
    finally:
        stop(direct)
    return config, results


def run_queue_wait_s(pid: int) -> float:
    """Seconds the threads of `pid` have spent runnable but waiting for a CPU (the second field of
    /proc/PID/task/TID/schedstat): what other work on its cores took from it."""
    total = 0
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((t / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _own_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of one process (all its threads, no children)."""
    return (cpu_ticks(f"/proc/{pid}/stat") or 0) / CLK_TCK


def _children_cpu() -> float:
    """User+system CPU seconds of this process's waited-for children so far (aiperf and its workers)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def hpa_count(bed: Bed) -> int:
    """HorizontalPodAutoscalers on the test bed: none means nothing asks the metrics adapter to scrape
    the pod's /metrics during the run."""
    r = bed.env.tb.kubectl("get", "hpa", "-A", "-o", "name", check=False)
    return len(r.stdout.split())


_RATIOS = (
    ("output_tokens_per_s", "tokens_per_s_ratio"),
    ("ttft_ms_p50", "ttft_p50_ratio"),
    ("itl_ms_p50", "itl_p50_ratio"),
    ("server_ms_per_token", "server_ms_per_token_ratio"),
)


def ratios(
    results: list[dict[str, Any]], concurrency: Sequence[int], over: str = "deployment", base: str = "direct"
) -> list[dict[str, Any]]:
    """Side `over` over side `base` at each concurrency, medians over the rounds: tokens/s, TTFT p50 and
    ITL p50 (the ratio of the two sides' medians), and the tokens/s ratio of each round."""
    out = []
    for c in concurrency:
        d = [r for r in results if r["side"] == base and r["concurrency"] == c]
        s = [r for r in results if r["side"] == over and r["concurrency"] == c]
        row: dict[str, Any] = {"concurrency": c}
        for key, name in _RATIOS:
            row[name] = _ratio(_median(s, key), _median(d, key))
        rounds = sorted({r.get("round", 0) for r in d})
        if len(rounds) > 1:
            row["tokens_per_s_ratio_by_round"] = [
                _ratio(_median([r for r in s if r.get("round", 0) == k], "output_tokens_per_s"),
                       _median([r for r in d if r.get("round", 0) == k], "output_tokens_per_s"))
                for k in rounds
            ]  # fmt: skip
        out.append(row)
    return out


def _median(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def _ratio(x: float | None, y: float | None) -> float | None:
    return round(x / y, 2) if x is not None and y else None


@contextlib.contextmanager
def testbed(root: Path) -> Iterator[Any]:
    """The test bed at `root`, started here unless it is up (and then stopped when no one uses it)."""
    from trtforge_dev.testbed import handle
    from trtforge_dev.testbed.paths import StatePaths

    paths = StatePaths(root)
    tb = handle.acquire(paths)
    try:
        yield tb
    finally:
        handle.release(paths)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests and tokens (a smoke run)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--requests", type=int, default=None, help="requests per point (default: 4x concurrency)")
    ap.add_argument("--input-tokens", type=int, default=None)
    ap.add_argument("--output-tokens", type=int, default=None)
    ap.add_argument(
        "--server-cpus",
        default="0",
        help="taskset list for both llama-servers (at least the pod's tuned threads: threads pinned to "
        "fewer cores spin against each other)",
    )
    ap.add_argument(
        "--support-cpus",
        default="1",
        help="taskset list for everything else of ours, from the start: the test bed (so the tune Job "
        "benches the threads these CPUs allow), the operator, the pod's supervisor ('': the "
        "supervisor beside the servers, the rest unpinned)",
    )
    ap.add_argument("--client-cpus", default="1", help="taskset list for aiperf")
    ap.add_argument(
        "--rounds", type=int, default=2, help="passes over the concurrencies (2: ABBA at each); medians"
    )
    ap.add_argument(
        "--compare-only", action="store_true", help="after the cold start, only the comparison (no second "
        "namespace, no redeploy)",
    )  # fmt: skip
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds from an apply to the first token")
    ap.add_argument("--root", type=Path, default=CACHE / "cluster", help="the test bed's state directory")
    ap.add_argument("--name", default=NAME, help="the results file's name")
    a = ap.parse_args(argv)
    isl = a.input_tokens or (32 if a.quick else 128)
    osl = a.output_tokens or (16 if a.quick else 64)
    from trtforge_dev.testbed import smollm2

    work = CACHE / NAME
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    AIPERF.ensure()
    load0 = os.getloadavg()[0]
    args = argv if argv is not None else sys.argv[1:]
    startup: dict[str, Any] = {}
    with testbed(a.root) as tb:
        bed = Bed(tb, work)
        try:
            bed.env.start()
            if a.support_cpus:  # before the Jobs: the tune Job benches the threads its affinity allows
                pin(support_pids(bed, []), a.support_cpus)
            gguf = smollm2.smollm2_gguf()
            shutil.copyfile(gguf, bed.env.models_dir / gguf.name)
            log("cold: an empty store")
            startup["cold"] = bed.apply_to_first_token(bed.cold_ns, True, a.timeout)
            log(f"cold: {startup['cold']}")
            ip, port = bed.openai_address(bed.cold_ns) or ("", 0)
            config, results = compare(a, bed, ip, port, work, isl, osl)
            if not a.compare_only:
                log("checkpoint in the store: the same engine in a second namespace")
                startup["in_store"] = bed.apply_to_first_token(bed.warm_ns, True, a.timeout)
                log(f"in store: {startup['in_store']}")
                bed.delete_deployment(bed.cold_ns)
                log("redeploy: the InferenceDeployment applied again beside its Ready engine")
                startup["redeploy"] = bed.apply_to_first_token(bed.cold_ns, False, a.timeout)
                log(f"redeploy: {startup['redeploy']}")
        finally:
            bed.env.close()
    rs = ratios(results, a.concurrency)
    path = write_result(
        a.name,
        {
            "config": {
                **config, "gguf": gguf.name, "input_tokens": isl, "output_tokens": osl,
                "server_cpus": a.server_cpus, "support_cpus": a.support_cpus, "client_cpus": a.client_cpus,
                "rounds": a.rounds, "quick": a.quick,
                "aiperf": AIPERF.version("aiperf"), "loadavg_1m_at_start": round(load0, 2),
                "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
                "command": " ".join([f"python -m benchmarks.{NAME}", *args]),
            },
            "startup": startup,
            "results": results,
            "ratios": rs,
            "mean_tokens_per_s_ratio": statistics.mean(
                r["tokens_per_s_ratio"] for r in rs if r["tokens_per_s_ratio"]
            ),
        },
    )  # fmt: skip
    print(render(json.loads(path.read_text())))
    return 0


def tokens_per_cpu_second(row: dict[str, Any], output_tokens: int) -> float | None:
    """Output tokens of a point's completed requests per CPU second of its llama-server: the work per
    token, whatever share of the core the side got."""
    done, cpu = row.get("completed_requests"), row.get("server_cpu_s")
    return round(done * output_tokens / cpu, 1) if done and cpu else None


def render(res: dict[str, Any]) -> str:
    """The results block of docs/benchmarks.md §8: apply to first token, then the aiperf table."""
    cfg = res["config"]
    st = cfg["settings"]
    s = res["startup"]
    labels = (("cold (empty store)", "cold"), ("checkpoint in the store", "in_store"),
              ("redeploy (engine Ready)", "redeploy"))  # fmt: skip
    starts = "; ".join(
        f"{what} {s[k]['first_token_s']} s"
        + (f" (engine Ready at {s[k]['engine_ready_s']} s, " if k != "redeploy" else " (")
        + f"endpoint ready at {s[k]['endpoint_ready_s']} s)"
        for what, k in labels
        if k in s
    )
    rows = [
        [r["concurrency"], r.get("round", 0), r["side"], r["output_tokens_per_s"], r["ttft_ms_p50"],
         r["ttft_ms_p90"], r["itl_ms_p50"], r.get("server_ms_per_token"), r["server_cpu_s"],
         tokens_per_cpu_second(r, cfg["output_tokens"]), r.get("loadavg_1m")]
        for r in sorted(res["results"], key=lambda r: (r["concurrency"], r.get("round", 0)))
    ]  # fmt: skip
    ratio = res["ratios"]
    cs = ", ".join(str(r["concurrency"]) for r in ratio)
    tps = ", ".join(f"{r['tokens_per_s_ratio']}x" for r in ratio)
    ttft = ", ".join(f"{r['ttft_p50_ratio']}x" for r in ratio)
    own = ", ".join(f"{r['server_ms_per_token_ratio']}x" for r in ratio if r.get("server_ms_per_token_ratio"))
    n_rounds = int(cfg.get("rounds", 1))
    rounds = f"{n_rounds} rounds, the sides alternating (ABBA)" if n_rounds > 1 else "one round"
    medians = " (medians over the rounds)" if n_rounds > 1 else ""
    support = (
        f"the supervisor, test bed and operator on CPU {cfg['support_cpus']}, "
        if cfg.get("support_cpus")
        else "the supervisor beside them, "
    )
    prose = (
        f"From `kubectl apply` to the first streamed token: {starts}. "
        f"Pod's llama-server (both sides): {st['threads']} thread(s), batch {st['batch']}, context "
        f"{st['ctx']}, {st['parallel']} slots; servers on CPU {cfg['server_cpus']}, "
        f"{support}aiperf on CPU {cfg['client_cpus']}; {cfg['input_tokens']} prompt and "
        f"{cfg['output_tokens']} output tokens; {rounds}; 1-min load average "
        f"{cfg['loadavg_1m_at_start']} at the start, {cfg['loadavg_1m_at_end']} at the end. "
        f"Deployment over direct{medians}: tokens/s {tps} and TTFT p50 {ttft} at c = {cs}"
        + (f"; llama-server's own decode ms/token {own}" if own else "")
        + "."
    )
    return "\n".join(
        [
            prose,
            table(
                [
                    "c",
                    "round",
                    "side",
                    "tokens/s",
                    "TTFT p50 ms",
                    "TTFT p90 ms",
                    "ITL p50 ms",
                    "server ms/token",
                    "server CPU s",
                    "tokens per CPU s",
                    "load 1m",
                ],
                rows,
            ),
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
