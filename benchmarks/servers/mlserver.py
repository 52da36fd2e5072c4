"""MLServer with a custom ONNX Runtime runtime (:mod:`benchmarks.servers.mlserver_runtime`).

Per launch a folder holds ``settings.json`` (ports, ``parallel_workers``) and the model's
``model-settings.json`` (``max_batch_size``, ``max_batch_time`` for adaptive batching, the session's
threads, the tensors of its metadata). The setting's instances are MLServer's parallel inference
workers; one instance runs in the server process itself (``parallel_workers: 0``), which skips the
hop to a worker. Its REST endpoint takes JSON tensors only, and it is the one perf_analyzer can
drive (:mod:`.mlserver_runtime`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks.common import free_ports
from benchmarks.servers import Kind, Launch, Model, Setting
from benchmarks.servers.venvs import MLSERVER

HERE = Path(__file__).resolve().parent


def launch(model: Model, s: Setting, http_port: int, grpc_port: int, work: Path) -> Launch:
    d = work / f"mlserver-{http_port}"
    shutil.rmtree(d, ignore_errors=True)
    (d / model.name).mkdir(parents=True)
    settings = {
        "debug": False,
        "host": "127.0.0.1",
        "http_port": http_port,
        "grpc_port": grpc_port,
        "metrics_port": next(p for p in free_ports(3) if p not in (http_port, grpc_port)),
        "parallel_workers": s.instances if s.instances > 1 else 0,
        "load_models_at_startup": True,
    }
    (d / "settings.json").write_text(json.dumps(settings, indent=1))
    model_settings = {
        "name": model.name,
        "implementation": "mlserver_runtime.OrtRuntime",
        "max_batch_size": s.max_batch,
        "max_batch_time": s.queue_delay_us / 1e6,
        "parameters": {"uri": str(model.file), "extra": {"threads": s.threads}},
        # the tensors of the model's metadata, which perf_analyzer builds its requests from
        "inputs": [{"name": model.input, "datatype": "FP32", "shape": [-1, *model.input_shape]}],
        "outputs": [{"name": model.output, "datatype": "FP32", "shape": [-1, *model.output_shape]}],
    }
    (d / model.name / "model-settings.json").write_text(json.dumps(model_settings, indent=1))
    shutil.copy2(HERE / "mlserver_runtime.py", d / model.name / "mlserver_runtime.py")
    cmd = [str(MLSERVER.path / "bin" / "mlserver"), "start", str(d)]
    env = {"PYTHONPATH": str(d / model.name)}
    # perf_analyzer cannot drive MLServer's gRPC (no ModelConfig RPC: mlserver_runtime's docstring)
    return Launch(cmd, env, http_port, grpc_port, ("json",), [d])


def version() -> dict[str, str]:
    return {
        "mlserver": MLSERVER.version("mlserver"),
        "uvloop": MLSERVER.version("uvloop"),
        "onnxruntime": MLSERVER.version("onnxruntime"),
    }


def setting(cores: int) -> Setting:
    """One session of every thread in the server process, adaptive batches of up to 32."""
    return Setting(1, cores, 32, 0)


KIND = Kind("mlserver", "MLServer", setting, launch, version)
