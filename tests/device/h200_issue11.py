"""Issue 11 on a real GPU: NVML GPU-instance profiles, the identity check, the lean TensorRT runtime.

Not a pytest module: it needs an NVIDIA GPU, nvidia-ml-py and the wheels tensorrt-lean-cu13-libs +
tensorrt-lean-cu13-bindings (and pydantic, aiohttp, prometheus-client). Run it with the project's
``trtforge`` and ``trtforge_runtime`` packages on PYTHONPATH (not from a directory that shadows them):

    PYTHONPATH=$PWD:$PWD/runtime_image python3 tests/device/h200_issue11.py

It prints everything it checks, writes a JSON summary to $OUT/device-check.json (default /tmp/out)
and exits non-zero if a check fails. What it printed on an H200 is in docs/gpu-probe-h200.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
results: dict[str, object] = {}
failures: list[str] = []


def check(name: str, ok: bool, detail: object = "") -> None:
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
    results[name] = {"ok": ok, "detail": detail}
    if not ok:
        failures.append(name)


def section(title: str) -> None:
    print(f"\n===== {title} =====", flush=True)


# ---------------------------------------------------------------- (a) NVML GPU-instance profiles
section("NVML GPU-instance profile table, through the probe's own code")
import pynvml  # noqa: E402

from trtforge.contract.gpu import KNOWN_GPUS  # noqa: E402
from trtforge.contract.gpu_probe import NVMLProbe, probe_identity  # noqa: E402

probe = NVMLProbe()
print("driver", pynvml.nvmlSystemGetDriverVersion(), "NVML", pynvml.nvmlSystemGetNVMLVersion())
devs = probe.devices()
for d in devs:
    print("device", d.model_dump(exclude={"xid_events"}))
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print("MIG mode (current, pending):", pynvml.nvmlDeviceGetMigMode(h))
table = probe.gpu_instance_profiles(0)
print(f"{'index':>5} {'id':>3} {'name':<14} {'slices':>6} {'inst':>4} {'SMs':>4} {'MiB':>7}")
for p in table:
    row = (p.index, p.id, p.name, p.slices, p.instances, p.sm_count, p.memory_mib)
    print("{:>5} {:>3} {:<14} {:>6} {:>4} {:>4} {:>7}".format(*row))
results["probe_table"] = [p.model_dump() for p in table]

# What the driver reports, read independently of the probe: every profile index, raw struct fields.
raw = {}
for idx in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
    try:
        info = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(h, idx, 2)
    except pynvml.NVMLError as e:
        print(f"profile index {idx}: {e}")
        continue
    name = info.name.decode() if isinstance(info.name, bytes) else info.name
    raw[name.replace("MIG ", "")] = (int(info.id), int(info.multiprocessorCount), int(info.memorySizeMB))
probe_rows = {p.name: (p.id, p.sm_count, p.memory_mib) for p in table}
check("probe table == driver (every profile)", probe_rows == raw and len(raw) > 0, {"driver": raw})

smi = subprocess.run(["nvidia-smi", "mig", "-lgip"], capture_output=True, text=True)
print("nvidia-smi mig -lgip (rc", smi.returncode, "):\n" + smi.stdout + smi.stderr)
results["nvidia_smi_lgip"] = {"rc": smi.returncode, "out": smi.stdout + smi.stderr}

known = KNOWN_GPUS["NVIDIA-H200"].mig
for name, f in known.items():
    got = probe_rows.get(name)
    check(
        f"known-GPU table row {name} == NVML",
        got is not None and (got[1], got[2]) == (f.sm_count, f.memory_mib),
        {"nvml": got, "table": (f.sm_count, f.memory_mib)},
    )

# ------------------------------------------------------------------ (b) the real identity check
section("identity check against the real probe")
from trtforge_runtime.errors import Refusal  # noqa: E402
from trtforge_runtime.lifecycle.identity import check_identity  # noqa: E402

from trtforge.contract.engine_key import BuildConfig  # noqa: E402
from trtforge.contract.manifest import Accuracy, CanaryRef, Manifest, TensorSpec  # noqa: E402

ident = probe_identity(probe)
print("probed identity:", ident.model_dump())


def manifest(gpu: object, **kw: object) -> Manifest:
    base = dict(
        key="a" * 64,
        engine_file="engine-x.plan",
        sha256="0" * 64,
        size_bytes=1,
        backend="tensorrt",
        backend_version="11.4.0.106",
        cuda="13.0",
        gpu=gpu,
        build=BuildConfig(precision="fp16", version_compatible=True),
        model_uri="file:///m.onnx",
        model_sha256="b" * 64,
        inputs=[TensorSpec(name="x", dtype="float32", shape=[-1, 16])],
        outputs=[TensorSpec(name="y", dtype="float32", shape=[-1, 4])],
        build_seconds=1.0,
        accuracy=Accuracy(samples=1, max_abs_error=0, max_rel_error=0, atol=1, rtol=1, passed=True),
        canary=CanaryRef(file="canary.npz", sha256="c" * 64, atol=1, rtol=1),
        recipe=2,
    )
    base.update(kw)
    return Manifest.model_validate(base)


try:
    check_identity(manifest(ident), ident)
    check("manifest recorded on this GPU is accepted", True, ident.product)
except Refusal as e:
    check("manifest recorded on this GPU is accepted", False, e.message)
for label, other in (
    ("another SM count (114)", ident.model_copy(update={"sm_count": 114})),
    ("another product (H100)", ident.model_copy(update={"product": "NVIDIA-H100-80GB-HBM3"})),
    ("a MIG slice (1g.35gb, 26 SMs)", ident.model_copy(update={"mig_profile": "1g.35gb", "sm_count": 26})),
):
    try:
        check_identity(manifest(other), ident)
        check(f"manifest for {label} refused", False, "accepted")
    except Refusal as e:
        check(f"manifest for {label} refused", e.reason == "GPUMismatch", e.message)

# ------------------------------------------------------- (c) the lean TensorRT runtime, for real
section("TensorRT lean runtime (tensorrt-lean-cu13 11.4 wheels)")
import tensorrt_lean_bindings as tlb  # noqa: E402

from trtforge.tensorrt import engine as trt_engine  # noqa: E402

print("tensorrt_lean_bindings", tlb.__version__, tlb.__file__)
logger = tlb.Logger(tlb.Logger.WARNING)
rt = tlb.Runtime(logger)
check("IRuntime created", rt is not None, type(rt).__name__)
check("engine_host_code_allowed exists", hasattr(rt, "engine_host_code_allowed"), rt.engine_host_code_allowed)
check("garbage plan -> None", rt.deserialize_cuda_engine(b"\0" * 1024) is None)

# The meta package `tensorrt-lean-cu13` installs `tensorrt_lean/__init__.py` re-exporting the bindings
# (NVIDIA/TensorRT python/packaging/frontend_sdist); its sdist needs NVIDIA's index, so it is written
# here with the same two lines.
shim = Path(tempfile.mkdtemp()) / "tensorrt_lean"
shim.mkdir()
(shim / "__init__.py").write_text(
    "from tensorrt_lean_bindings import *\nfrom tensorrt_lean_bindings import __version__\n"
)

from trtforge_runtime.backends.tensorrt_backend import TensorRTBackend  # noqa: E402

corrupt = os.urandom(4096)
foreign = bytearray(os.urandom(4096))  # a plan header ("ftrt" tag) claiming TensorRT 10.13.3.9
foreign[0:4] = (0x74727466).to_bytes(4, "little")
foreign[24:28] = bytes([10, 13, 3, 9])
foreign = bytes(foreign)
work = Path(tempfile.mkdtemp())
for as_name in ("tensorrt_lean_bindings", "tensorrt_lean"):
    if as_name == "tensorrt_lean":
        sys.path.insert(0, str(shim.parent))
    sys.modules.pop("tensorrt_lean", None)
    mod, found = trt_engine.import_tensorrt("lean")
    check(f"lean runtime imports as {as_name}", found == as_name, f"{found} {mod.__version__}")
    for label, plan in (("corrupt", corrupt), ("foreign (TensorRT 10.13 header)", foreign)):
        art = work / f"{label[:7]}.plan"
        art.write_bytes(plan)
        try:
            TensorRTBackend(manifest(ident), art, instances=1)
            check(f"{as_name}: {label} plan refused", False, "loaded")
        except Refusal as e:
            check(f"{as_name}: {label} plan refused", e.reason == "EngineLoadFailed", e.message)
        except BaseException as e:  # a crash would end the process; anything else is a bug
            check(f"{as_name}: {label} plan refused", False, repr(e))
try:
    TensorRTBackend(manifest(ident, build=BuildConfig(precision="fp16")), work / "corrupt.plan", instances=1)
    check("non-VC plan refused by the lean-only image", False, "loaded")
except Refusal as e:
    check("non-VC plan refused by the lean-only image", e.reason == "EngineLoadFailed", e.message)

# The runtime process end to end: fetch (sha256 verified) -> identity -> load -> exit code 83.
section("trtforge serve on a corrupt plan: the load exit code")
store = Path(tempfile.mkdtemp())
plan = corrupt
sha = hashlib.sha256(plan).hexdigest()
key = hashlib.sha256(b"device-check").hexdigest()
edir = store / "engines" / key
edir.mkdir(parents=True)
(edir / "engine-x.plan").write_bytes(plan)
(edir / "canary.npz").write_bytes(b"unused")
m = manifest(ident, key=key, sha256=sha, size_bytes=len(plan))
m = m.model_copy(
    update={
        "canary": CanaryRef(file="canary.npz", sha256=hashlib.sha256(b"unused").hexdigest(), atol=1, rtol=1)
    }
)
(edir / "manifest.json").write_text(m.to_json())
term = store / "termination-log"
env = {
    **os.environ,
    "TRTFORGE_GPU_PROBE": "nvml",
    "TRTFORGE_TERMINATION_LOG": str(term),
    "TRTFORGE_LOG_FORMAT": "text",
}
p = subprocess.run(
    [
        sys.executable,
        "-c",
        "import sys; from trtforge.cli import main; sys.exit(main())",
        "serve",
        "--store",
        str(store),
        "--engine",
        key,
        "--port",
        "0",
        "--cache-dir",
        str(store / "cache"),
    ],
    env={**env, "PYTHONPATH": f"{shim.parent}:{env.get('PYTHONPATH', '')}"},
    capture_output=True,
    text=True,
    timeout=120,
    cwd=str(store),
)
print("exit code", p.returncode)
print("stderr tail:\n" + "\n".join(p.stderr.splitlines()[-8:]))
msg = term.read_text() if term.exists() else ""
print("termination message:", msg)
check(
    "serve exits with the load exit code (83) and a message, no traceback",
    p.returncode == 83 and "EngineLoadFailed" in msg and "Traceback" not in p.stderr,
    {"rc": p.returncode, "message": msg},
)

(OUT / "device-check.json").write_text(json.dumps(results, indent=2, default=str))
print("\nFAILURES:", failures or "none")
sys.exit(1 if failures else 0)
