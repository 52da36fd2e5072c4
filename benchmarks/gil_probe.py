"""Does ONNX Runtime hold the GIL while it builds a session? (docs/design.md, "Runtime cold start")

Builds the model's session on a thread while the main thread counts in a Python loop, and prints
the main thread's progress against the same loop alone: near 1.0 means the build released the GIL,
near 0 that it held it. Run it pinned to the cores of a pod:

    taskset -c 0,1 python -m benchmarks.gil_probe .cache/bench/models/resnet50.onnx
"""

from __future__ import annotations

import sys
import threading
import time


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort

    path = (argv if argv is not None else sys.argv[1:])[0]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")

    def build() -> float:
        t = time.perf_counter()
        ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        return time.perf_counter() - t

    build()  # the page cache and ONNX Runtime's own first-use work
    alone = build()
    t, spins_alone = time.perf_counter(), 0
    while time.perf_counter() - t < alone:
        spins_alone += 1
    took: list[float] = []
    th = threading.Thread(target=lambda: took.append(build()))
    th.start()
    spins = 0
    while th.is_alive():
        spins += 1
    print(
        f"session build {alone:.3f} s alone, {took[0]:.3f} s beside a busy main thread; the main thread "
        f"made {spins / spins_alone:.2f} of its progress alone (near 0: the build holds the GIL)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
