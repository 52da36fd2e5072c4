"""The shared CUDA layer (trtforge.tensorrt.cuda) on a real GPU: version, malloc, copies, streams.

Not a pytest module (it needs a GPU and libcudart on LD_LIBRARY_PATH). Run with the project's
packages on PYTHONPATH: ``PYTHONPATH=$PWD:$PWD/builder_job python3 tests/device/h200_cuda.py``.
What it printed on an H200 is in docs/gpu-probe-h200.md.
"""

import sys

import numpy as np

from trtforge.tensorrt.cuda import D2H, H2D, CudaError, CudaRuntime

fails = []


def check(name, ok, detail=""):
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
    if not ok:
        fails.append(name)


cuda = CudaRuntime()
print("libcudart:", cuda._lib._name)
check("cudaRuntimeGetVersion", cuda.version().count(".") == 1, cuda.version())
s = cuda.stream()
src = np.arange(1 << 18, dtype=np.float32)
dst = np.zeros_like(src)
p = cuda.malloc(src.nbytes)
cuda.copy_async(p, src.ctypes.data, src.nbytes, H2D, s)
cuda.copy_async(dst.ctypes.data, p, src.nbytes, D2H, s)
cuda.synchronize(s)
check("H2D then D2H round trip on a stream (1 MiB)", bool(np.array_equal(src, dst)), f"{src.nbytes} bytes")
cuda.free(p)
cuda.destroy_stream(s)
try:
    cuda.malloc(1 << 50)  # 1 PiB: refused by the driver, as a CudaError naming the call
    check("an impossible cudaMalloc raises CudaError", False, "allocated")
except CudaError as e:
    check("an impossible cudaMalloc raises CudaError", "cudaMalloc" in str(e) and not e.sticky, str(e))
left = cuda.last_error()  # CudaRuntime.check reads the failed call's error off
check("no error left behind by the refused cudaMalloc", left == 0, left)

from trtforge_builder.backends.tensorrt import cuda_version  # noqa: E402

check("the builder's CUDA version comes from the runtime", cuda_version() == cuda.version(), cuda_version())
print("FAILURES:", fails or "none")
sys.exit(1 if fails else 0)
