"""Triton Inference Server: the ``tritonserver`` binary of the PyPI wheel ``nvidia-pytriton``, with its
C++ HTTP and gRPC front ends and dynamic batcher, and a Python-backend model calling ONNX Runtime
(:mod:`benchmarks.servers.triton_model`).

The model repository is written per launch: ``config.pbtxt`` carries the setting (instance count,
``max_batch_size``, ``dynamic_batching.max_queue_delay_microseconds``, and the session's threads as
a parameter). The Python backend's stub embeds the venv's Python: ``LD_LIBRARY_PATH`` points at that
Python's libdir (its libpython) and at the wheel's bundled libraries, and the venv's ``bin`` leads
``PATH``: the embedded interpreter finds its home through the ``python3`` it finds there, so it runs
with the venv's site-packages (onnxruntime, and the numpy below 2 this Triton build needs).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from benchmarks.common import CACHE
from benchmarks.servers import Kind, Launch, Model, Setting
from benchmarks.servers.venvs import TRITON, python_libdir, python_version, site_packages

HERE = Path(__file__).resolve().parent
# Triton's Python backend moves tensors between the server and each stub through shared memory;
# start each region big enough for a batch of 32 ResNet-50 inputs so it never grows under load.
SHM = "python,shm-default-byte-size=33554432"


def _dims(shape: tuple[int, ...]) -> str:
    return ", ".join(str(d) for d in shape)


def model_config(model: Model, s: Setting) -> str:
    return f"""name: "{model.name}"
backend: "python"
max_batch_size: {s.max_batch}
input [{{ name: "{model.input}" data_type: TYPE_FP32 dims: [ {_dims(model.input_shape)} ] }}]
output [{{ name: "{model.output}" data_type: TYPE_FP32 dims: [ {_dims(model.output_shape)} ] }}]
instance_group [{{ count: {s.instances} kind: KIND_CPU }}]
dynamic_batching {{ max_queue_delay_microseconds: {s.queue_delay_us} }}
parameters: {{ key: "ort_threads" value: {{ string_value: "{s.threads}" }} }}
parameters: {{ key: "model_file" value: {{ string_value: "{model.file}" }} }}
"""


@functools.cache
def _site() -> Path:
    return site_packages(TRITON)


@functools.cache
def _server_dir() -> Path:
    return _site() / "pytriton" / "tritonserver"


@functools.cache
def backends_dir() -> Path:
    """A backend directory whose python/ holds the stub built for the venv's Python version."""
    src = _server_dir()
    dst = CACHE / "triton" / "backends"
    py = dst / "python"
    py.mkdir(parents=True, exist_ok=True)
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        shutil.copy2(src / "backends" / "python" / f, py / f)
    stub = src / "python_backend_stubs" / python_version(TRITON) / "triton_python_backend_stub"
    shutil.copy2(stub, py / "triton_python_backend_stub")
    return dst


def launch(model: Model, s: Setting, http_port: int, grpc_port: int, work: Path) -> Launch:
    repo = work / f"triton-repo-{http_port}"
    shutil.rmtree(repo, ignore_errors=True)
    (repo / model.name / "1").mkdir(parents=True)
    (repo / model.name / "config.pbtxt").write_text(model_config(model, s))
    shutil.copy2(HERE / "triton_model.py", repo / model.name / "1" / "model.py")
    cmd = [
        str(_server_dir() / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backends_dir()}",
        f"--backend-config={SHM}",
        "--http-address=127.0.0.1",
        f"--http-port={http_port}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={grpc_port}",
        "--allow-metrics=false",
        "--allow-gpu-metrics=false",
        "--allow-cpu-metrics=false",
        "--strict-readiness=true",
        "--log-verbose=0",
    ]
    # The stub, copied out of the wheel, no longer finds the wheel's bundled libraries by its RPATH.
    libs = [str(python_libdir(TRITON)), str(_site() / "nvidia_pytriton.libs")]
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join([*libs, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])]),
        "PATH": os.pathsep.join([str(TRITON.path / "bin"), os.environ.get("PATH", "")]),
    }
    return Launch(cmd, env, http_port, grpc_port, ("http", "grpc"), [repo])


def version() -> dict[str, str]:
    return {
        "nvidia-pytriton": TRITON.version("nvidia-pytriton"),
        "onnxruntime": TRITON.version("onnxruntime"),
    }


def setting(cores: int) -> Setting:
    """One single-thread model instance per core, batches of up to 2 after a 2 ms queue delay."""
    return Setting(cores, 1, 2, 2000)


KIND = Kind("triton", "Triton (nvidia-pytriton tritonserver)", setting, launch, version)
