"""KServe's Python model server wrapping an ONNX Runtime session (:mod:`.kserve_server`).

KServe's Python server has no batcher (batching lives in its Go agent sidecar, which is not on
PyPI); its setting's variant names KServe's own knob: ``predict`` on the event loop (its documented
custom-model pattern) or handed to the thread pool. Its instances
are uvicorn workers, each with its own session; gRPC is KServe's own v2 gRPC server.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.servers import Kind, Launch, Model, Setting
from benchmarks.servers.venvs import KSERVE

HERE = Path(__file__).resolve().parent


def setting(cores: int) -> Setting:
    """One uvicorn worker with a session of every thread, ``predict`` on the event loop: with more
    workers, uvicorn starts them afresh and they lack the config route (kserve_server's docstring)."""
    return Setting(1, cores, 1, 0, "predict on the event loop")


def launch(model: Model, s: Setting, http_port: int, grpc_port: int, work: Path) -> Launch:
    mode = "executor" if "thread pool" in s.variant else "sync"
    # Run from a folder of its own: beside this module, `import kserve` would find this module.
    d = work / f"kserve-{http_port}"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy2(HERE / "kserve_server.py", d / "kserve_server.py")
    cmd = [
        str(KSERVE.python),
        str(d / "kserve_server.py"),
        "--model_file",
        str(model.file),
        "--model_name",
        model.name,
        "--http_port",
        str(http_port),
        "--grpc_port",
        str(grpc_port),
        "--ort_threads",
        str(s.threads),
        "--workers",
        str(s.instances),
        "--predict_mode",
        mode,
        "--enable_latency_logging",
        "false" if "(defaults)" not in s.variant else "true",
    ]
    # perf_analyzer cannot drive KServe's gRPC (no ModelConfig RPC: kserve_server's docstring)
    return Launch(cmd, {}, http_port, grpc_port, ("http",), [d])


def version() -> dict[str, str]:
    return {"kserve": KSERVE.version("kserve"), "onnxruntime": KSERVE.version("onnxruntime")}


KIND = Kind("kserve", "KServe", setting, launch, version)
