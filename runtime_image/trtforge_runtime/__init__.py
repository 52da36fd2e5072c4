"""`trtforge serve`: fetch, verify, load and serve one engine over the KServe Open Inference Protocol (v2).

Never imports kopf or a Kubernetes client: the runtime image carries only the contract, the stores
and an inference backend.
"""
