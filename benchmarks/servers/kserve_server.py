"""The KServe peer: KServe's Python model server wrapping an ONNX Runtime session.

Runs in its own virtual environment (``.cache/bench-kserve-venv``, kserve and onnxruntime only), so
KServe's pins never touch the project's. The session gets exactly the settings trtforge's ONNX
Runtime backend uses (intra-op threads given on the command line, one inter-op thread, sequential
execution, all graph optimisations, no spinning).

``--predict_mode sync`` is KServe's documented custom-model pattern (``def predict``, run on the event
loop); ``--predict_mode executor`` makes ``predict`` a coroutine that hands ``session.run`` to the
server's thread pool, so the event loop keeps parsing requests while the session runs. KServe's
own v2 gRPC server listens on ``--grpc_port``.

KServe lacks Triton's model-configuration extension, which ``perf_analyzer`` reads before any load
(for the model's max batch size): :func:`triton_config` answers ``GET /v2/models/NAME/config`` as a
route of KServe's own FastAPI app (its requests may carry any batch, so 32 lets perf_analyzer
send batches of one). It is called once per perf_analyzer
run, never on the inference path. KServe's gRPC has no such hook, so perf_analyzer drives KServe over
HTTP only.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import kserve
import numpy as np
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


def _session(path: str, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])


class OrtModel(Model):
    def __init__(self, name: str, path: str, threads: int) -> None:
        super().__init__(name)
        self.path = path
        self.threads = threads
        self.session: ort.InferenceSession | None = None
        self.outputs: list[str] = []

    def load(self) -> bool:
        self.session = _session(self.path, self.threads)
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.ready = True
        return self.ready

    # The tensors of the model's metadata, which perf_analyzer builds its requests from.
    def get_input_types(self) -> list[dict[str, object]]:
        return self._types(ort.InferenceSession(self.path).get_inputs())

    def get_output_types(self) -> list[dict[str, object]]:
        return self._types(ort.InferenceSession(self.path).get_outputs())

    @staticmethod
    def _types(args: list[ort.NodeArg]) -> list[dict[str, object]]:
        return [
            {"name": a.name, "datatype": "FP32", "shape": [d if isinstance(d, int) else -1 for d in a.shape]}
            for a in args
        ]

    # With --workers > 1 KServe pickles the model into each spawned worker process: each worker builds
    # its own session there (an ONNX Runtime session cannot be pickled).
    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["session"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.load()

    def _run(self, payload: InferRequest) -> InferResponse:
        assert self.session is not None
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        results = self.session.run(self.outputs, feeds)
        outs = []
        for name, arr in zip(self.outputs, results, strict=True):
            o = InferOutput(name=name, shape=list(arr.shape), datatype="FP32")
            o.set_data_from_numpy(np.ascontiguousarray(arr, dtype=np.float32), binary_data=True)
            outs.append(o)
        return InferResponse(
            model_name=self.name, infer_outputs=outs, response_id=payload.id, use_binary_outputs=True
        )


class SyncOrtModel(OrtModel):
    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
        return self._run(payload)


class ExecutorOrtModel(OrtModel):
    async def predict(self, payload: InferRequest, headers: dict[str, str] | None = None) -> InferResponse:
        return await asyncio.get_running_loop().run_in_executor(None, self._run, payload)


async def triton_config(model_name: str) -> dict[str, object]:
    """The part of a Triton model configuration that perf_analyzer reads."""
    return {"name": model_name, "platform": "onnxruntime_onnx", "max_batch_size": 32}


def main() -> None:
    p = argparse.ArgumentParser(parents=[kserve.model_server.parser], description=__doc__)
    p.add_argument("--model_file", required=True)
    p.add_argument("--ort_threads", type=int, default=1)
    p.add_argument("--predict_mode", choices=["sync", "executor"], default="sync")
    args, _ = p.parse_known_args()
    cls = SyncOrtModel if args.predict_mode == "sync" else ExecutorOrtModel
    model = cls(args.model_name, args.model_file, args.ort_threads)
    model.load()
    logging.getLogger().setLevel(logging.WARNING)
    # before the server registers its own routes, in this process (its workers are forked from it)
    kserve.model_server.app.add_api_route("/v2/models/{model_name}/config", triton_config, methods=["GET"])
    ModelServer(
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        workers=args.workers,
        enable_grpc=True,
        enable_latency_logging=args.enable_latency_logging,
        max_asyncio_workers=args.max_asyncio_workers,
    ).start([model])


if __name__ == "__main__":
    main()
