"""Control plane at scale: N TRTEngines x 3 GPU targets applied at once, with the operator running.

On the benchmark's own test bed (``trtforge cluster --root .cache/bench/cluster up``: a real
kube-apiserver, controller-manager and scheduler, emulated GPU nodes), with ``trtforge operator``
as a process scoped to one tenant namespace and a build namespace (``trtforge_dev.localdev``):

- **cache**: one seed TRTEngine (pinned sha256, three targets) is built for real first; then N
  TRTEngines with the same model and targets are applied in one ``kubectl apply``. Measured: time
  until every target of every engine is Ready from the store, with no Job.
- **jobs**: N TRTEngines each pinning a different model sha256, so every target needs a build. A
  ResourceQuota of zero pods in the build namespace keeps the Jobs from running (1,500 local build
  processes would measure the laptop, not the operator); the build limits are raised so none is
  queued. Each engine's proof of possession is written into the store first, as the broker records
  it after a verify Job (N verify pods would measure the test bed's kubelet, and these pins name no
  real model). Measured: time until all 3N Jobs exist.
- For both: the operator's peak RSS (VmHWM, fresh operator per case); API requests per engine
  (``apiserver_request_total`` from the apiserver's /metrics, less our own polling and the idle
  rate measured just before); and in the cache case a quiet window after everything is Ready:
  resourceVersion changes of the TRTEngines and the operator's own reconcile and status-write
  counters (target: zero writes when nothing changes).
- For every case the 1-minute load average before and after, since the test bed, the operator and
  this harness share the machine's cores: a run on a busy machine says so in its results.

The full grid, on a quiet machine, writes benchmarks/results/controlplane.json, the plot
docs/img/bench-controlplane.png and the tables of docs/benchmarks.md:

    python -m benchmarks.controlplane --n 100,500,1000,2000 --scenarios cache,jobs

(3 runs of each N, verdicts on the medians: about 1-1.5 h on 2 cores). While developing, a small
run that leaves docs/ alone:

    python -m benchmarks.controlplane --n 50 --runs 1 --scenarios cache --quiet 10 --no-docs \
        --result controlplane-dev
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    CACHE,
    http_get,
    log,
    peak_rss_bytes,
    tree_cpu_seconds,
    write_result,
)
from benchmarks.controlplane_summary import RUNS, render, verdicts
from benchmarks.testbed import TestbedUnavailable, cluster, ensure_testbed, not_measured, operator_counters

GROUP, VERSION = "trtforge.io", "v1alpha1"
TARGETS = [
    {"gpu": "NVIDIA-H100-80GB-HBM3"},
    {"gpu": "NVIDIA-GH200-480GB"},
    {"gpu": "NVIDIA-B200", "mig": "3g.90gb"},
]
TENANT = f"bench-tenant-{time.strftime('%H%M%S')}"
KIND = 'kind="trte"'  # the label value the operator's counters use for TRTEngines


class Counted:
    """Our own API calls, to subtract them from the apiserver's count."""

    def __init__(self) -> None:
        self.n = 0


def apiserver_requests(tb: Any) -> tuple[float, dict[str, float]]:
    """Total of apiserver_request_total and the split by resource/verb; the split also holds the
    apiserver's own seconds spent per resource/verb (``apiserver_request_duration_seconds_sum``) under
    keys that start with ``seconds ``."""
    text = tb.kubectl("get", "--raw", "/metrics", timeout=60).stdout
    total = 0.0
    by: dict[str, float] = {}
    for line in text.splitlines():
        seconds = line.startswith("apiserver_request_duration_seconds_sum{")
        if not (seconds or line.startswith("apiserver_request_total{")):
            continue
        labels, value = line.rsplit(" ", 1)
        v = float(value)
        if not seconds:
            total += v
        res = re.search(r'resource="([^"]*)"', labels)
        verb = re.search(r'verb="([^"]*)"', labels)
        sub = re.search(r'subresource="([^"]*)"', labels)
        k = f"{verb.group(1) if verb else '?'} {res.group(1) if res else '?'}"
        if sub and sub.group(1):
            k += f"/{sub.group(1)}"
        if seconds:
            k = f"seconds {k}"
        by[k] = by.get(k, 0.0) + v
    return total, by


def _sum(counters: dict[str, float], prefix: str, contains: str = "") -> float:
    return sum(v for k, v in counters.items() if k.startswith(prefix) and contains in k)


def engine_docs(n: int, prefix: str, sha: str | None, model_uri: str) -> list[dict[str, Any]]:
    docs = []
    for i in range(n):
        pin = sha or hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest()
        docs.append(
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "TRTEngine",
                "metadata": {"name": f"{prefix}-{i:04d}", "labels": {"bench": prefix}},
                "spec": {
                    "model": {"uri": model_uri, "sha256": pin},
                    "precision": "fp32",
                    "targets": TARGETS,
                },
            }
        )
    return docs


def record_possession(store_dir: Path, docs: list[dict[str, Any]]) -> None:
    """What the broker records once a verify Job proved the namespace holds each engine's model."""
    from trtforge.contract.possession import PossessionRecord, possession_path, source_fingerprint

    for d in docs:
        m = d["spec"]["model"]
        fp = source_fingerprint(m["uri"], None, m["sha256"])
        rec = PossessionRecord(
            namespace=TENANT, fingerprint=fp, sha256=m["sha256"], size_bytes=1, uri=m["uri"]
        )
        path = store_dir / possession_path(TENANT, fp)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rec.to_json())


def create_concurrently(tb: Any, docs: list[dict[str, Any]], workers: int = 16) -> float:
    """Create every TRTEngine through the API with `workers` clients at once (kubectl apply would
    dominate the measurement); returns the monotonic time of the last create's answer."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client

    apis = [tb.api_client() for _ in range(workers)]
    last = [0.0]

    def one(i: int) -> None:
        co: Any = client.CustomObjectsApi(apis[i % workers])
        co.create_namespaced_custom_object(GROUP, VERSION, TENANT, "trtengines", docs[i])
        last[0] = max(last[0], time.monotonic())

    try:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, range(len(docs))))
    finally:
        for a in apis:
            a.close()
    return last[0]


def list_engines(api: Any, counted: Counted, selector: str) -> list[dict[str, Any]]:
    from kubernetes import client

    counted.n += 1
    co: Any = client.CustomObjectsApi(api)
    items: list[dict[str, Any]] = co.list_namespaced_custom_object(
        GROUP, VERSION, TENANT, "trtengines", label_selector=selector
    )["items"]
    return items


def is_building(o: dict[str, Any]) -> bool:
    """Whether an engine's status shows every one of its targets with a build Job (the status write
    that follows the Job POSTs)."""
    targets = (o.get("status") or {}).get("targets") or []
    return len(targets) == len(TARGETS) and all(t.get("jobName") for t in targets)


class EngineWatch:
    """Which TRTEngines of `selector` are Ready and which are building, kept from one watch stream
    (a thread) rather than polled: listing and decoding every engine twice a second cost the
    harness and the apiserver O(N) per poll, over a wait that itself grows with N, on the cores the
    operator shares (docs/benchmarks.md §4). A watch costs one decode per change."""

    def __init__(self, api: Any, counted: Counted, selector: str) -> None:
        from kubernetes import client
        from trtforge_dev.testbed.kube import list_then_watch

        self._co: Any = client.CustomObjectsApi(api)
        self._selector, self._counted = selector, counted
        self._state: dict[str, tuple[bool, bool]] = {}  # name -> (Ready, building)
        self._stopped = threading.Event()
        args = (self._list, self._watch_call, self._on_event, self._stopped.is_set, self._failed)
        self._thread = threading.Thread(
            target=list_then_watch,
            args=(*args, GROUP, VERSION, TENANT, "trtengines"),
            kwargs={"label_selector": selector, "timeout_seconds": 300},
            name="engine-watch",
            daemon=True,
        )
        self._thread.start()

    def _list(self) -> str:
        self._counted.n += 1
        page = self._co.list_namespaced_custom_object(
            GROUP, VERSION, TENANT, "trtengines", label_selector=self._selector
        )
        self._state = {o["metadata"]["name"]: self._facts(o) for o in page["items"]}
        return str(page["metadata"]["resourceVersion"])

    def _watch_call(self, *args: Any, **kwargs: Any) -> Any:
        self._counted.n += 1  # one request per watch stream
        return self._co.list_namespaced_custom_object(*args, **kwargs)

    def _on_event(self, kind: str, o: dict[str, Any]) -> None:
        name = o["metadata"]["name"]
        if kind == "DELETED":
            self._state.pop(name, None)
        else:
            self._state[name] = self._facts(o)

    @staticmethod
    def _failed(e: BaseException) -> None:
        log(f"engine watch: {e!r}; listing again")

    @staticmethod
    def _facts(o: dict[str, Any]) -> tuple[bool, bool]:
        from trtforge_dev.localdev import is_true

        return is_true(o, "Ready"), is_building(o)

    def ready(self) -> int:
        return sum(r for r, _ in list(self._state.values()))

    def building(self) -> int:
        return sum(b for _, b in list(self._state.values()))

    def stop(self) -> None:
        """The thread ends at the stream's next event (the engines' deletion follows at once)."""
        self._stopped.set()


def count_jobs(api: Any, counted: Counted, ns: str) -> int:
    """How many Jobs the build namespace `ns` holds (the benchmark's own: only the operator makes Jobs
    there). One item and the apiserver's ``remainingItemCount``: listing and decoding every Job on
    each poll cost the harness and the apiserver O(N) per poll, a load on the shared cores that grew
    with N by itself (docs/benchmarks.md §4e)."""
    from kubernetes import client

    counted.n += 1
    batch: Any = client.BatchV1Api(api)
    raw = batch.list_namespaced_job(ns, limit=1, _preload_content=False)
    page = json.loads(raw.data)
    return len(page.get("items") or []) + int((page.get("metadata") or {}).get("remainingItemCount") or 0)


def restart_operator(env: Any, timeout: float = 60) -> None:
    env.op.stop()
    env.op.start()
    port = env.config["liveness_port"]
    deadline = time.monotonic() + timeout
    while http_get(f"http://127.0.0.1:{port}/healthz", timeout=1)[0] != 200:
        if time.monotonic() > deadline or not env.op.alive():
            raise RuntimeError(f"operator did not come up:\n{env.op.tail()}")
        time.sleep(0.2)


def settle_load(max_load: float, timeout: float) -> dict[str, Any]:
    """Wait until the 1-minute load average is at most `max_load`, for at most `timeout` seconds.

    The cases run one after another on the same cores, and the load a case leaves behind (the
    previous case's deletions, the Job controller's retries) would otherwise be carried into the
    next: in the 15:52 grid the N = 2000 cache case began at load 2.2 and the N = 500 one at 0.4.
    Returns what was waited for and why it stopped, for the results."""
    t0 = time.monotonic()
    start = os.getloadavg()[0]
    while True:
        now = os.getloadavg()[0]
        waited = time.monotonic() - t0
        if now <= max_load:
            reason = "settled"
            break
        if waited >= timeout:
            reason = f"timeout: load {now:.2f} still above {max_load} after {waited:.0f}s (machine busy?)"
            log(reason)
            break
        time.sleep(2)
    if waited >= 2:
        log(f"waited {waited:.0f}s for the load to settle: {start:.2f} -> {now:.2f} ({reason})")
    return {
        "max_load": max_load,
        "load_at_start": round(start, 2),
        "load_at_end": round(now, 2),
        "waited_s": round(waited, 1),
        "reason": reason,
    }


def delete_all(env: Any, counted: Counted, selector: str, timeout: float = 600) -> None:
    env.tb.kubectl("delete", "trtengines", "-n", TENANT, "-l", selector, "--wait=false", timeout=300)
    deadline = time.monotonic() + timeout
    while list_engines(env.api, counted, selector):
        if time.monotonic() > deadline:
            log("engines still present after delete; stripping finalizers")
            for o in list_engines(env.api, counted, selector):
                env.tb.kubectl(
                    "patch",
                    "trtengine",
                    o["metadata"]["name"],
                    "-n",
                    TENANT,
                    "--type=merge",
                    "-p",
                    '{"metadata":{"finalizers":null}}',
                    check=False,
                )
            break
        time.sleep(1)


def run_case(
    env: Any,
    scenario: str,
    n: int,
    sha: str | None,
    model_uri: str,
    quiet: float,
    timeout: float,
    settle: tuple[float, float] = (1.0, 240.0),
) -> dict[str, Any]:
    counted = Counted()
    prefix = f"{scenario}{n}"
    selector = f"bench={prefix}"
    restart_operator(env)
    settled = settle_load(*settle)
    mport = env.config["metrics_port"]
    # idle rate of API requests with the operator up and nothing to do
    time.sleep(3)
    idle0_t, (idle0, _) = time.monotonic(), apiserver_requests(env.tb)
    time.sleep(10)
    idle1_t, (idle1, _) = time.monotonic(), apiserver_requests(env.tb)
    idle_rate = max(0.0, (idle1 - idle0 - 1) / (idle1_t - idle0_t))  # -1: the metrics GET itself
    jobs0 = count_jobs(env.api, counted, env.build_ns)
    c0 = operator_counters(mport)
    req0, by0 = apiserver_requests(env.tb)
    docs = engine_docs(n, prefix, sha, model_uri)
    if scenario == "jobs":
        record_possession(env.store_dir, docs)
    engines = EngineWatch(env.api, counted, selector)
    load_before = os.getloadavg()[0]
    t_start = time.monotonic()
    t0 = create_concurrently(env.tb, docs)  # done_s counts from the last create, apply_s up to it
    t_applied = t0 - t_start
    done_s: float | None = None
    progress = 0
    while time.monotonic() - t0 < timeout:
        if scenario == "cache":
            progress = engines.ready()
            done = progress == n
        else:
            progress = count_jobs(env.api, counted, env.build_ns) - jobs0
            done = progress >= 3 * n
        if done:
            done_s = time.monotonic() - t0
            break
        time.sleep(0.5)
    status_s: float | None = None
    if scenario == "jobs" and done_s is not None:
        # The Jobs exist; the engines' status writes that name them may still be on their way. The
        # issue times the Jobs, but a status that lags far behind would be work deferred, not saved.
        while time.monotonic() - t0 < timeout:
            if engines.building() == n:
                status_s = time.monotonic() - t0
                break
            time.sleep(0.5)
    t_window = time.monotonic() - t0
    engines.stop()
    req1, by1 = apiserver_requests(env.tb)
    c1 = operator_counters(mport)
    own = counted.n + 2  # our polls and the two metrics GETs
    api_total = req1 - req0
    # - n: our creates; POST pods: the Job controller trying the held builds' pods (not the operator)
    job_controller = by1.get("POST pods", 0) - by0.get("POST pods", 0)
    api_operator = max(0.0, api_total - own - idle_rate * t_window - n - job_controller)
    diff = {k: by1.get(k, 0) - by0.get(k, 0) for k in by1}
    top = sorted(((k, v) for k, v in diff.items() if not k.startswith("seconds ")), key=lambda kv: -kv[1])[:8]
    busiest = sorted(
        ((k, v) for k, v in diff.items() if k.startswith("seconds ") and " WATCH" not in k),
        key=lambda kv: -kv[1],
    )
    res: dict[str, Any] = {
        "scenario": scenario,
        "n": n,
        "targets": 3 * n,
        "apply_s": round(t_applied, 2),
        "done_s": round(done_s, 2) if done_s is not None else None,
        "progress_at_end": progress,
        # jobs: until every engine's status names its three Jobs (after done_s)
        "status_done_s": round(status_s, 2) if status_s is not None else None,
        "loadavg_1m_before": round(load_before, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "load_settle": settled,
        "cpus": os.cpu_count(),
        "operator_peak_rss_mb": None,
        "api_requests_total": int(api_total),
        "api_requests_idle_rate_per_s": round(idle_rate, 2),
        "api_requests_per_engine": round(api_operator / n, 2),
        "api_top": {k: int(v) for k, v in top if v > 0},
        # where the apiserver spent its time: seconds summed over requests, by verb and resource
        "api_seconds_top": {k.removeprefix("seconds "): round(v, 1) for k, v in busiest[:8] if v > 0},
        "jobs_created": _sum(c1, "trtforge_build_jobs_created_total")
        - _sum(c0, "trtforge_build_jobs_created_total"),
        "cache_hits": _sum(c1, "trtforge_engine_cache_hits_total")
        - _sum(c0, "trtforge_engine_cache_hits_total"),
        "reconciles": _sum(c1, "trtforge_reconciles_total", KIND)
        - _sum(c0, "trtforge_reconciles_total", KIND),
        # Operator time spent reconciling TRTEngines, per engine (sum of trtforge_reconcile_seconds).
        "reconcile_s_per_engine": round(
            (
                _sum(c1, "trtforge_reconcile_seconds_sum", KIND)
                - _sum(c0, "trtforge_reconcile_seconds_sum", KIND)
            )
            / n,
            4,
        ),
        "status_writes": _sum(c1, "trtforge_status_writes_total", KIND)
        - _sum(c0, "trtforge_status_writes_total", KIND),
    }
    if scenario == "cache" and done_s is not None and quiet > 0:
        before = {
            o["metadata"]["name"]: o["metadata"]["resourceVersion"]
            for o in list_engines(env.api, counted, "")
        }
        q0 = operator_counters(mport)
        r0, qby0 = apiserver_requests(env.tb)
        cpu0 = tree_cpu_seconds(env.op.proc.pid) if env.op.proc is not None else 0.0
        time.sleep(quiet)
        cpu1 = tree_cpu_seconds(env.op.proc.pid) if env.op.proc is not None else 0.0
        r1, qby1 = apiserver_requests(env.tb)
        q1 = operator_counters(mport)
        qtop = sorted(
            ((k, qby1.get(k, 0) - qby0.get(k, 0)) for k in qby1 if not k.startswith("seconds ")),
            key=lambda kv: -kv[1],
        )[:6]
        after = {
            o["metadata"]["name"]: o["metadata"]["resourceVersion"]
            for o in list_engines(env.api, counted, "")
        }
        rec = _sum(q1, "trtforge_reconciles_total", KIND) - _sum(q0, "trtforge_reconciles_total", KIND)
        wr = _sum(q1, "trtforge_status_writes_total", KIND) - _sum(q0, "trtforge_status_writes_total", KIND)
        res["quiet"] = {
            "seconds": quiet,
            "engines": len(after),
            "resource_version_changes": sum(1 for k, v in after.items() if before.get(k) != v),
            "changed": sorted(k for k, v in after.items() if before.get(k) != v)[:5],
            "reconciles": rec,
            "status_writes": wr,
            "writes_per_reconcile": round(wr / rec, 4) if rec else None,
            "operator_cpu_util": round((cpu1 - cpu0) / quiet, 3),
            "api_requests": int(r1 - r0 - 1),
            "api_requests_idle_baseline": int(idle_rate * quiet),
            "api_top": {k: int(v) for k, v in qtop if v > 0},
        }
    if env.op.proc is not None:
        res["operator_peak_rss_mb"] = round(peak_rss_bytes(env.op.proc.pid) / 2**20, 1)
    log(f"{scenario} N={n} measured (deleting now): {res}")
    delete_all(env, counted, selector)
    if scenario == "jobs":
        env.tb.kubectl(
            "delete", "jobs", "-n", env.build_ns, "--all", "--wait=false", timeout=300, check=False
        )
    return res


def seed(env: Any, timeout: float) -> tuple[str, str, float]:
    """Build the seed engine's three targets for real; (model sha256, model URI, seconds)."""
    from trtforge_dev.localdev import MODELS_CLAIM, engine_manifest, tiny_model

    sha = tiny_model(env.models_dir / "bench.onnx")
    uri = f"pvc://{MODELS_CLAIM}/bench.onnx"
    t0 = time.monotonic()
    env.apply(engine_manifest("seed", sha, TARGETS, model=uri), TENANT)
    env.wait_true("trtengines", TENANT, "seed", timeout=timeout)
    return sha, uri, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", default="100,500,1000,2000", help="engine counts, each x 3 targets")
    p.add_argument("--scenarios", default="cache,jobs")
    p.add_argument("--runs", type=int, default=RUNS, help="runs of each N (verdicts use the median)")
    p.add_argument("--quiet", type=float, default=60.0, help="seconds of the quiet window (cache scenario)")
    p.add_argument("--timeout", type=float, default=900.0, help="per case")
    p.add_argument("--root", default=str(CACHE / "cluster"), help="the benchmark's own test-bed state dir")
    p.add_argument("--keep-cluster", action="store_true")
    p.add_argument(
        "--settle-load",
        type=float,
        default=1.0,
        help="before each case, wait until the 1-minute load average is at most this (0: do not wait)",
    )
    p.add_argument(
        "--settle-timeout", type=float, default=240.0, help="seconds to wait for --settle-load at most"
    )
    p.add_argument(
        "--result", default="controlplane", help="results file name (benchmarks/results/NAME.json)"
    )
    p.add_argument(
        "--no-docs", action="store_true", help="leave docs/ alone (no plot, no tables): for trial runs"
    )
    a = p.parse_args(argv)
    root = Path(a.root)
    results: dict[str, Any] = {"cases": [], "not_measured": {}, "targets": TARGETS}
    try:
        from trtforge_dev.localdev import OperatorEnv
        from trtforge_dev.testbed.handle import TestBed
        from trtforge_dev.testbed.paths import StatePaths
        from trtforge_operator.config import OperatorConfig
    except ImportError as e:
        why = f"the test bed or the operator is not in this tree: {e}"
        return not_measured("controlplane", results, why, 0)
    try:
        started = ensure_testbed(root)
    except TestbedUnavailable as e:
        return not_measured("controlplane", results, str(e), 1)
    env = None
    try:
        tb = TestBed(StatePaths(root))
        big = 1_000_000
        env = OperatorEnv(
            tb,
            CACHE / "controlplane",
            [TENANT],
            build_ns=f"bench-build-{TENANT.rsplit('-', 1)[-1]}",
            build={"max_concurrent": big, "max_concurrent_per_namespace": big},
            # One replica: no Lease. On a loaded shared machine its 10 s renew deadline was missed and
            # the operator exited mid-run (12:15 UTC); the benchmark measures reconciling, not failover.
            leader_election={"enabled": False},
            # The product's resync periods, not the integration tests' faster 15 s: every object is
            # reconciled once per period, which at N = 2000 is itself a load worth measuring.
            resync_seconds=OperatorConfig.model_fields["resync_seconds"].default,
            engine_resync_seconds=OperatorConfig.model_fields["engine_resync_seconds"].default,
        )
        results["operator_resync_seconds"] = env.config["resync_seconds"]
        results["operator_engine_resync_seconds"] = env.config["engine_resync_seconds"]
        env.start()
        sha, uri, seed_s = seed(env, timeout=600)
        results["seed_build_s"] = round(seed_s, 1)
        log(f"seed engine built for {len(TARGETS)} targets in {seed_s:.1f}s")
        scenarios = a.scenarios.split(",")
        settle = (a.settle_load if a.settle_load > 0 else float("inf"), a.settle_timeout)
        ns_list = [int(x) for x in a.n.split(",")]
        # Rounds of every N rather than one N's runs back to back: a busy spell of the machine then
        # lands on every N alike, not on one.
        if "cache" in scenarios:
            for run in range(a.runs):
                for n in ns_list:
                    r = {**run_case(env, "cache", n, sha, uri, a.quiet, a.timeout, settle), "run": run}
                    log(f"cache N={n} run {run + 1}: {r}")
                    results["cases"].append(r)
        if "jobs" in scenarios:
            quota = {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "bench-no-pods"},
                "spec": {"hard": {"pods": "0"}},
            }
            env.apply(quota, env.build_ns)
            for run in range(a.runs):
                for n in ns_list:
                    r = {**run_case(env, "jobs", n, None, uri, 0, a.timeout, settle), "run": run}
                    log(f"jobs N={n} run {run + 1}: {r}")
                    results["cases"].append(r)
    finally:
        if env is not None:
            env.close()
        if started and not a.keep_cluster:
            cluster(root, "down")
    results["verdicts"] = verdicts(results["cases"])
    path = write_result(a.result, results)
    print(render(results))
    if not a.no_docs and a.result == "controlplane":
        from benchmarks import plots, report

        plots.controlplane(json.loads(path.read_text()))
        report.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
