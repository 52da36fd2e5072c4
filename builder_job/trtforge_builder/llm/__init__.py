"""The LLM forge steps: quantize a checkpoint (with its accuracy gate and canary) and tune it per
target (docs/llm.md). llama.cpp on the test bed; ModelOpt and TensorRT-LLM on GPUs."""
