"""The product's images and its default store claim: one set of names that the operator's defaults,
`make images` (trtforge_dev.images), the chart's values and the docs agree on
(tests/unit/test_front_door.py checks the chart and the docs against this module).

The engine broker runs from the operator image (`trtforge broker`), so there is no image of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VERSION = "0.1.0"  # the chart's appVersion and every distribution's version
DEFAULT_REGISTRY = "ghcr.io/trtforge"
# The chart's claim for release `trtforge` (`<release>-engines`), and the operator's default store.
STORE_CLAIM = "trtforge-engines"
DEFAULT_STORE_URI = f"pvc://{STORE_CLAIM}/"
# The TensorRT container the builder image starts from (nvcr.io/nvidia/tensorrt:<this>-py3).
TENSORRT_CONTAINER_VERSION = "25.09"


@dataclass(frozen=True)
class ImageSpec:
    """One image: its repository under the registry, tag suffix, Dockerfile and build arguments."""

    key: str  # the chart's `images.<key>` (camelCase there: runtimeFull)
    repository: str
    dockerfile: str
    build_args: dict[str, str] = field(default_factory=dict)
    tag_suffix: str = ""

    def reference(self, registry: str = DEFAULT_REGISTRY, version: str = VERSION) -> str:
        repo = f"{registry.rstrip('/')}/{self.repository}" if registry else self.repository
        return f"{repo}:{version}{self.tag_suffix}"


OPERATOR = ImageSpec("operator", "trtforge-operator", "operator/Dockerfile")
BUILDER = ImageSpec(
    "builder",
    "trtforge-builder",
    "builder_job/Dockerfile",
    {"TENSORRT_CONTAINER_VERSION": TENSORRT_CONTAINER_VERSION},
)
# The slim runtime (lean TensorRT): loads version-compatible engines only.
RUNTIME = ImageSpec("runtime", "trtforge-runtime", "runtime_image/Dockerfile", {"TENSORRT_RUNTIME": "lean"})
# The full runtime: loads every engine built with the builder's TensorRT version.
RUNTIME_FULL = ImageSpec(
    "runtimeFull", "trtforge-runtime", "runtime_image/Dockerfile", {"TENSORRT_RUNTIME": "full"}, "-full"
)
# In build order: the runtimes take the builder's TensorRT version (an engine is tied to it).
IMAGES: tuple[ImageSpec, ...] = (BUILDER, OPERATOR, RUNTIME, RUNTIME_FULL)
