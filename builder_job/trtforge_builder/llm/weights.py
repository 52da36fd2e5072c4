"""A checkpoint's weights, counted from its own headers: the parameter count and the bytes of its
tensors as written (quantized). The quantize step records both in the manifest so the operator checks
each target's memory without a hint (docs/llm.md §"Recipes by GPU").

A GGUF is read with the ``gguf`` package (llama.cpp's own reader; it maps the file and reads the tensor
infos, not the data); a safetensors file by its header (an 8-byte little-endian length, then JSON of
each tensor's dtype, shape and byte range: the format's whole index, no tensor data read).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own limit on the JSON header


class WeightsError(ValueError):
    """A file whose tensors cannot be counted; the message names it."""


@dataclass(frozen=True)
class Weights:
    parameters: int
    bytes: int

    def __add__(self, other: Weights) -> Weights:
        return Weights(self.parameters + other.parameters, self.bytes + other.bytes)


def gguf_weights(path: Path) -> Weights:
    """The tensors of a GGUF file (elements and bytes as stored, whatever the quantization type)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, struct.error) as e:
        raise WeightsError(f"{path}: not a readable GGUF file ({e})") from e
    return Weights(
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        bytes=sum(int(t.n_bytes) for t in reader.tensors),
    )


def safetensors_weights(path: Path) -> Weights:
    """The tensors a safetensors file's header lists (its ``__metadata__`` entry aside)."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise WeightsError(f"{path}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_SAFETENSORS_HEADER:
            raise WeightsError(f"{path}: header of {n} bytes, past the format's {MAX_SAFETENSORS_HEADER}")
        try:
            index = json.loads(f.read(n))
        except ValueError as e:
            raise WeightsError(f"{path}: the safetensors header is not JSON ({e})") from e
    if not isinstance(index, dict):
        raise WeightsError(f"{path}: the safetensors header is not a JSON object")
    total = Weights(0, 0)
    for name, t in index.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = t["data_offsets"]
            total += Weights(math.prod(int(d) for d in t["shape"]), int(end) - int(begin))
        except (KeyError, TypeError, ValueError) as e:
            raise WeightsError(f"{path}: tensor {name!r} has no shape or data_offsets ({e})") from e
    return total


def checkpoint_weights(folder: Path, model_file: str) -> Weights:
    """A checkpoint's weights: its GGUF file, or every ``*.safetensors`` under a Hugging Face folder."""
    if model_file.endswith(".gguf"):
        return gguf_weights(folder / model_file)
    files = sorted(folder.rglob("*.safetensors"))
    if not files:
        raise WeightsError(f"{folder}: no .safetensors file to count the weights of")
    total = Weights(0, 0)
    for p in files:
        total += safetensors_weights(p)
    return total
