"""The test bed's stand-in for a different container image (the emulated kubelet ignores images).

The kubelet puts this directory on PYTHONPATH of a container whose env sets
``TRTFORGE_TESTBED_BACKEND_VERSION``; Python then runs this at start-up, and the container's ONNX
Runtime reports that version, as if the pod ran an image with another backend build. Product code
is unchanged: it reads ``onnxruntime.__version__`` as always. See trtforge_dev.testbed.kubelet.podspec.
"""

import os

_version = os.environ.get("TRTFORGE_TESTBED_BACKEND_VERSION")
if _version:
    import onnxruntime

    onnxruntime.__version__ = _version
