"""Triton's Python-backend model for the benchmark: one ONNX Runtime session per model instance.

Triton copies this file into the model repository as ``<model>/1/model.py`` and runs it in its
``triton_python_backend_stub`` process, one stub per instance. The session gets exactly the settings
of trtforge's ONNX Runtime backend; the intra-op threads come from the model config's ``ort_threads``
parameter. Triton's dynamic batcher hands ``execute`` several requests at once: their inputs are
concatenated into one batch and the output rows are handed back to each request.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils  # provided by the stub process


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(params["ort_threads"])
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            params["model_file"], sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self.input = cfg["input"][0]["name"]
        self.output = cfg["output"][0]["name"]

    def execute(self, requests: list[Any]) -> list[Any]:
        xs = [pb_utils.get_input_tensor_by_name(r, self.input).as_numpy() for r in requests]
        x = xs[0] if len(xs) == 1 else np.concatenate(xs)
        (y,) = self.session.run([self.output], {self.input: x})
        responses, row = [], 0
        for part in xs:
            n = part.shape[0]
            out = pb_utils.Tensor(self.output, np.ascontiguousarray(y[row : row + n]))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            row += n
        return responses
