"""MLServer's custom runtime for the benchmark: one ONNX Runtime session per model instance.

MLServer imports this module in its own venv (``implementation: mlserver_runtime.OrtRuntime`` in
``model-settings.json``). The session gets exactly the settings of trtforge's ONNX Runtime backend,
with the intra-op threads from the model's ``parameters.extra.threads``. With adaptive batching on,
MLServer concatenates requests before ``predict`` and splits the answer after it; with parallel
workers, each worker process loads its own session. ``session.run`` goes to a thread so the event
loop keeps reading requests while the session computes.

MLServer lacks Triton's model-configuration extension, which ``perf_analyzer`` reads before any
load (for the model's max batch size): :meth:`OrtRuntime.triton_config` answers
``GET /v2/models/NAME/config`` as a custom REST handler. It is called once per perf_analyzer run,
never on the inference path. MLServer's gRPC has no such hook, so perf_analyzer drives MLServer over
REST only.
"""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.handlers import custom_handler
from mlserver.types import InferenceRequest, InferenceResponse


class OrtRuntime(MLModel):
    async def load(self) -> bool:
        params = self.settings.parameters
        assert params is not None and params.uri is not None
        extra = params.extra or {}
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(extra["threads"])
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(params.uri, sess_options=opts, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name
        self.output = self.session.get_outputs()[0].name
        return True

    @custom_handler(rest_path="/v2/models/{model_name}/config", rest_method="GET")
    async def triton_config(self, model_name: str) -> dict[str, object]:
        """The part of a Triton model configuration that perf_analyzer reads."""
        return {
            "name": self.name,
            "platform": "onnxruntime_onnx",
            "max_batch_size": self.settings.max_batch_size,
        }

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = np.ascontiguousarray(NumpyCodec.decode_input(payload.inputs[0]), dtype=np.float32)
        loop = asyncio.get_running_loop()
        (y,) = await loop.run_in_executor(None, self.session.run, [self.output], {self.input: x})
        out = NumpyCodec.encode_output(self.output, np.asarray(y))
        # An output's "parameters" tell a Triton client its binary size; MLServer's JSON-only answer
        # has none, and tritonclient's C++ HTTP client (perf_analyzer's) reads one from any it finds.
        out.parameters = None
        return InferenceResponse(model_name=self.name, outputs=[out])
