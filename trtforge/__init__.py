"""trtforge: a Kubernetes operator for the whole life of NVIDIA TensorRT engines."""

__version__ = "0.1.0"
