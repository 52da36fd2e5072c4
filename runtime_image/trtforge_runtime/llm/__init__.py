"""LLM serving: a rank supervisor that verifies an LLM's artefacts and starts its server.

The server (``llama-server`` on CPUs, ``trtllm-serve`` on GPUs) serves the OpenAI API on its own port;
the supervisor owns the probes and the metrics port (docs/design.md §"LLM serving").
"""
