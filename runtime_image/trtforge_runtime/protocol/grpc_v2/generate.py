"""Regenerate the shipped stubs from inference.proto:
``python -m trtforge_runtime.protocol.grpc_v2.generate``.

Needs ``grpcio-tools`` (a dev dependency, pinned so that the output is reproducible); the runtime
itself needs only ``grpcio`` and ``protobuf``. :func:`generate` writes into any directory, which is
how tests/unit/test_runtime_grpc.py checks the shipped files for drift.

One change is made to protoc's output: the messages go into a descriptor pool of their own instead
of protobuf's default pool. The protocol's messages are named ``inference.*`` by every
implementation, so with the default pool a process that also imports another client's stubs
(tritonclient's, in the tests and benchmarks) would fail with "duplicate symbol".
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO = "trtforge_runtime/protocol/grpc_v2/inference.proto"
OUTPUTS = ("inference_pb2.py", "inference_pb2.pyi", "inference_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc on inference.proto with `out_root` as the package root; the files written."""
    from grpc_tools import protoc

    root = HERE.parents[2]  # runtime_image/
    out_root.mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{root}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        str(root / PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {root / PROTO}")
    files = [out_root / "trtforge_runtime" / "protocol" / "grpc_v2" / name for name in OUTPUTS]
    messages = files[0]
    text = messages.read_text()
    if text.count(_DEFAULT_POOL) != 1:
        raise RuntimeError(f"protoc's output changed: {_DEFAULT_POOL!r} is not in {messages} once")
    messages.write_text(text.replace(_DEFAULT_POOL, _OWN_POOL))
    return files


_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = (
    "# trtforge: a pool of its own, so that other v2 stubs (also `inference.*`) can live in the same\n"
    "# process (see generate.py).\n"
    "_POOL = _descriptor_pool.DescriptorPool()\n"
    "DESCRIPTOR = _POOL.AddSerializedFile("
)


def main() -> int:
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for f in generate(Path(tmp)):
            shutil.copyfile(f, HERE / f.name)
            print(f"wrote {HERE / f.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
