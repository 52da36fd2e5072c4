"""The one TensorRT layer the builder and the runtime share (docs/design.md §"TensorRT").

- :mod:`trtforge.tensorrt.policy`: every decision that needs no TensorRT, as pure functions: builder
  flags per precision and TensorRT major, which runtime may load a plan, dtype names, which
  optimization profile serves a batch, which ONNX initializers may be cast to fp16/bf16.
- :mod:`trtforge.tensorrt.cuda`: the few CUDA runtime calls, through ctypes (``libcudart``).
- :mod:`trtforge.tensorrt.engine`: the thin layer that applies the policies to the real TensorRT:
  import (full or lean, under either package name), load, refit, run, close.

Importing this package (or the policy) never imports TensorRT; only calls into
:mod:`trtforge.tensorrt.engine` do. The builder and the runtime import it; it imports neither.
"""
