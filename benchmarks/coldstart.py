"""Cold start: ``trtforge serve`` from process start to ready, against the floor.

For the ~100 MB ResNet-50 artifact, from a PVC-style local store (``pvc://``) and from S3 (moto's
server mode on 127.0.0.1): process start → ``/v2/health/ready`` answers 200, i.e. fetch (streamed,
sha256-checked into an empty cache dir, as in a new pod), GPU-identity check, load, canary. Also a
container restart (the cache dir already holds the verified artifact).

The floor is a fresh Python process that does only what cannot be avoided: import ONNX Runtime, read
the artifact (the file, or one S3 GET), create the session with the same settings, and say so.
Both are measured the same way (wall clock from ``Popen`` to the moment they report done), pinned to
the same cores; the page cache is warm for both (the file was just written), as on a node that
already pulled the engine's volume blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    CACHE,
    free_port,
    free_ports,
    http_get,
    log,
    serve_cmd,
    start,
    stop,
    table,
    taskset,
    wait_http_ok,
    write_result,
)
from benchmarks.engines import ensure_engine, store_dir
from benchmarks.models import model_file
from benchmarks.servers.trtforge import grpc_supported

BUCKET = "trtforge-bench"
SERVE_PHASES = (
    "total_s",
    "to_listening_s",
    "warm_began_s",
    "warm_done_s",
    "warm_fetch_s",
    "warm_load_s",
    "fetch_s",
    "load_s",
    "canary_s",
)
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
}

# --- the floor (runs as its own process: `python -m benchmarks.coldstart --floor ...`) ----------
FLOOR_SCRIPT = r"""
import json, os, sys, time
t0 = time.time()
import onnxruntime as ort
t_import = time.time()
src = sys.argv[1]
if src.startswith("s3://"):
    import boto3
    bucket, key = src[5:].split("/", 1)
    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    t_client = time.time()
    data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
else:
    t_client = time.time()
    with open(src, "rb") as f:
        data = f.read()
t_read = time.time()
o = ort.SessionOptions()
o.intra_op_num_threads = int(sys.argv[2])
o.inter_op_num_threads = 1
o.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
o.add_session_config_entry("session.intra_op.allow_spinning", "0")
s = ort.InferenceSession(data, sess_options=o, providers=["CPUExecutionProvider"])
t_done = time.time()
print(json.dumps({"done_epoch": t_done, "python_start_epoch": t0, "import_s": t_import - t0,
                  "read_s": t_read - t_import,
                  "client_s": t_client - t_import, "session_s": t_done - t_read, "bytes": len(data)}),
      flush=True)
"""


def run_floor(src: str, cpus: str, threads: int, env: dict[str, str]) -> dict[str, Any]:
    cmd = taskset(cpus, [sys.executable, "-c", FLOOR_SCRIPT, src, str(threads)])
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"floor failed: {r.stderr[-2000:]}")
    d: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    d["total_s"] = d["done_epoch"] - t0
    d["interpreter_s"] = d["python_start_epoch"] - t0
    return d


# --- the runtime ----------------------------------------------------------------------------------
def _phases(log_path: Path, t0_epoch: float) -> dict[str, float]:
    """Phase seconds from the runtime's own JSON log lines."""
    out: dict[str, float] = {}
    for line in log_path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        msg = rec.get("msg", "")
        if msg == "listening" and "ts" in rec:
            out["to_listening_s"] = float(rec["ts"]) - t0_epoch
        if msg == "warm start began" and "ts" in rec:
            out["warm_began_s"] = float(rec["ts"]) - t0_epoch
        elif msg.startswith("warm start") and "ts" in rec:
            out["warm_done_s"] = float(rec["ts"]) - t0_epoch  # engine verified and loaded
        for k in ("fetch_s", "load_s", "canary_s", "warm_fetch_s", "warm_load_s"):
            if k in rec:
                out[k] = float(rec[k])
    return out


def run_serve(
    store_uri: str, key: str, cache: Path, cpus: str, env: dict[str, str], log_path: Path
) -> dict[str, Any]:
    port, grpc_port = free_ports(2)
    cmd = taskset(
        cpus,
        serve_cmd(
            store_uri,
            key,
            "resnet50",
            port,
            cache,
            *(["--grpc-port", str(grpc_port)] if grpc_supported() else []),  # on, as by default
        ),
    )
    t0 = time.time()
    p = start(cmd, log_path, {"TRTFORGE_GPU_PROBE": "none", **env})
    try:
        secs = wait_http_ok(f"http://127.0.0.1:{port}/v2/health/ready", timeout=300, proc=p, interval=0.005)
        total = time.time() - t0
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    finally:
        stop(p)
    del secs
    d: dict[str, Any] = {"total_s": total, **_phases(log_path, t0)}
    if status == 200:
        for phase in ("fetch", "load", "canary"):
            m = re.search(
                rf'trtforge_runtime_startup_seconds\{{phase="{phase}"\}} ([0-9.e+-]+)', body.decode()
            )
            if m:
                d[f"{phase}_s"] = float(m.group(1))
    return d


# --- S3 (moto) --------------------------------------------------------------------------------------
class Moto:
    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        exe = Path(sys.executable).parent / "moto_server"
        self.proc = start([str(exe), "-H", "127.0.0.1", "-p", str(self.port)], log_dir / "moto.log")
        deadline = time.monotonic() + 60
        while http_get(self.url + "/moto-api/")[0] == 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                stop(self.proc)
                raise RuntimeError("moto_server did not start")
            time.sleep(0.1)

    def upload(self, local_store: Path, prefix: str) -> None:
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.url, **_boto_kwargs())
        s3.create_bucket(Bucket=BUCKET)
        files = sorted(p for p in local_store.rglob("*") if p.is_file() and not p.name.startswith("."))
        files.sort(key=lambda p: p.name == "manifest.json")  # the manifest last: it is the commit
        for f in files:
            s3.upload_file(str(f), BUCKET, f"{prefix}/{f.relative_to(local_store)}")

    def close(self) -> None:
        stop(self.proc)


def _boto_kwargs() -> dict[str, str]:
    return {
        "aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": S3_ENV["AWS_REGION"],
    }


def s3_supported() -> str | None:
    """None when this tree's store can open s3:// URIs, else why not."""
    try:
        from trtforge.store import open_store  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return "trtforge.store.open_store is not in this tree"
    try:
        open_store(f"s3://{BUCKET}/probe")
    except Exception as e:
        if "not supported" in str(e) or "unknown" in str(e).lower():
            return f"trtforge.store cannot open s3:// URIs: {e}"
    return None


def _median(runs: list[dict[str, Any]], k: str) -> float | None:
    vals = [r[k] for r in runs if k in r]
    return round(statistics.median(vals), 3) if vals else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument(
        "--reps",
        type=int,
        default=15,
        help="starts of each kind; the tables show medians and the spread (one start moves by ±5%%"
        " on a shared 2-core machine, the whole margin to the target; the S3 floor by ±15%%)",
    )
    p.add_argument("--cpus", default=f"0-{(os.cpu_count() or 1) - 1}")
    p.add_argument("--sources", default="pvc,s3")
    p.add_argument(
        "--name",
        default="coldstart",
        help="the result file's name under benchmarks/results/ (an A/B keeps each run's own file)",
    )
    a = p.parse_args(argv)
    threads = len(range(int(a.cpus.split("-")[0]), int(a.cpus.split("-")[-1]) + 1))
    log_dir = CACHE / "logs"
    store = store_dir(a.model)
    key, publisher = ensure_engine(model_file(a.model), store)
    mdir = store / "engines" / key
    manifest = json.loads((mdir / "manifest.json").read_text())
    artifact = mdir / manifest["engine_file"]
    files = {f.name: f.stat().st_size for f in mdir.iterdir() if f.is_file() and not f.name.startswith(".")}
    log(f"engine {key[:12]}… artifact {artifact.stat().st_size / 1e6:.1f} MB, files {files}")
    pvc_root = store.parent.parent  # .cache/bench/stores: pvc://<publisher>/<model>
    pvc_env = {"TRTFORGE_PVC_ROOT": str(pvc_root)}
    pvc_uri = f"pvc://{store.parent.name}/{store.name}"
    results: dict[str, Any] = {
        "model": a.model,
        "engine_key": key,
        "publisher": publisher,
        "artifact_bytes": artifact.stat().st_size,
        "store_files_bytes": files,
        "cpus": a.cpus,
        "threads": threads,
        "sources": {},
        "not_measured": {},
    }
    sources = a.sources.split(",")
    moto: Moto | None = None
    if "s3" in sources:
        why = s3_supported()
        if why:
            results["not_measured"]["s3"] = why
            sources.remove("s3")
            log(f"S3 not measured: {why}")
        else:
            moto = Moto(log_dir)
            moto.upload(store, "store")
    try:
        for src in sources:
            if src == "pvc":
                uri, env, floor_src = pvc_uri, pvc_env, str(artifact)
            else:
                assert moto is not None
                uri = f"s3://{BUCKET}/store"
                env = {**S3_ENV, "AWS_ENDPOINT_URL": moto.url}
                floor_src = f"s3://{BUCKET}/store/engines/{key}/{artifact.name}"
            floors, colds, warms = [], [], []
            for i in range(a.reps):
                floors.append(run_floor(floor_src, a.cpus, threads, env))
                cache = CACHE / "coldstart-cache" / f"{src}-{i}"
                shutil.rmtree(cache, ignore_errors=True)
                colds.append(run_serve(uri, key, cache, a.cpus, env, log_dir / f"coldstart-{src}-{i}.log"))
                if src == "pvc":
                    warms.append(
                        run_serve(uri, key, cache, a.cpus, env, log_dir / f"coldstart-{src}-{i}-restart.log")
                    )
                shutil.rmtree(cache, ignore_errors=True)
                log(
                    f"  {src} #{i}: floor {floors[-1]['total_s']:.2f}s, serve {colds[-1]['total_s']:.2f}s"
                    + (f", restart {warms[-1]['total_s']:.2f}s" if warms else "")
                )
            fl = _median(floors, "total_s")
            entry: dict[str, Any] = {
                "uri": uri,
                "floor": {
                    k: _median(floors, k)
                    for k in ("total_s", "interpreter_s", "import_s", "read_s", "client_s", "session_s")
                },
                "serve_cold": {k: _median(colds, k) for k in SERVE_PHASES},
            }
            entry["ratio_cold"] = round(entry["serve_cold"]["total_s"] / fl, 2) if fl else None
            if warms:
                entry["serve_restart"] = {k: _median(warms, k) for k in SERVE_PHASES}
                entry["ratio_restart"] = round(entry["serve_restart"]["total_s"] / fl, 2) if fl else None
            entry["runs"] = {
                "floor": [round(r["total_s"], 3) for r in floors],
                "cold": [round(r["total_s"], 3) for r in colds],
                **({"restart": [round(r["total_s"], 3) for r in warms]} if warms else {}),
            }
            results["sources"][src] = entry
    finally:
        if moto is not None:
            moto.close()
    write_result(a.name, results)
    print(render(results))
    return 0


def _spread(values: list[float] | None) -> str:
    """ "min-max" of one kind of start's seconds; "-" for results recorded without them."""
    return f"{min(values):.3f}-{max(values):.3f}" if values else "-"


def render(results: dict[str, Any]) -> str:
    rows = []
    for src, e in results["sources"].items():
        fl = e["floor"]
        runs = e.get("runs", {})
        for label, k, ratio, run_key in (
            ("cold (empty cache)", "serve_cold", "ratio_cold", "cold"),
            ("restart", "serve_restart", "ratio_restart", "restart"),
        ):
            if k not in e:
                continue
            s = e[k]
            rows.append(
                [
                    src,
                    label,
                    s["total_s"],
                    _spread(runs.get(run_key)),
                    s.get("warm_began_s"),
                    s.get("to_listening_s"),
                    s.get("warm_done_s"),
                    s.get("warm_fetch_s", s.get("fetch_s")),
                    s.get("warm_load_s", s.get("load_s")),
                    s.get("canary_s"),
                    fl["total_s"],
                    _spread(runs.get("floor")),
                    fl["read_s"],
                    fl["client_s"] if src == "s3" and fl.get("client_s") is not None else "-",
                    fl["session_s"],
                    f"{e[ratio]}x",
                ]
            )
    head = (
        f"Cold start of {results['model']} ({results['artifact_bytes'] / 1e6:.0f} MB artifact, engine by "
        f"{results['publisher']}), cpus {results['cpus']}, median of runs; target ≤ 1.25x the floor"
    )
    t = table(
        [
            "store",
            "start",
            "ready s",
            "starts, min-max s",
            "warm start began at s",
            "listening at s",
            "engine loaded at s",
            "verify/fetch s",
            "load s",
            "canary s",
            "floor s",
            "floor, min-max s",
            "floor read s",
            "of which S3 client s",
            "floor session s",
            "vs floor",
        ],
        rows,
    )
    nm = "".join(f"\nnot measured: {k}: {v}" for k, v in results["not_measured"].items())
    note = (
        "\n\n'listening at' and 'engine loaded at' are seconds after the process started; the engine's"
        " verify/fetch and load run on a thread while the HTTP server imports (the warm start), so"
        " the phases overlap and do not add up to 'ready'. 'of which S3 client s' is the floor's boto3"
        " import and client before its one GET; the runtime reads S3 through a botocore client"
        ' (docs/design.md, "Runtime cold start").'
    )
    return f"{head}\n{t}{nm}{note}"


if __name__ == "__main__":
    sys.exit(main())
