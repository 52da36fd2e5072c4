"""The LLM canary: the server's greedy tokens for the canary prompt must equal the golden tokens that
the quantize step recorded with the checkpoint (temperature 0, a fixed number of tokens). A mismatch
means a wrong checkpoint, a wrong server build or broken numerics on this device: the pod stays
not ready and says which token differed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CanarySpec:
    """The canary prompt and its golden greedy token ids."""

    prompt: str
    golden: tuple[int, ...]
    text: str = ""  # the golden tokens' text: what a server that answers text only is compared with

    @property
    def n_tokens(self) -> int:
        return len(self.golden)


@dataclass(frozen=True)
class CanaryOutcome:
    passed: bool
    message: str


def compare(golden: Sequence[int], got: Sequence[int]) -> CanaryOutcome:
    """Equal token for token, and as many; the message names the first difference."""
    for i, (want, have) in enumerate(zip(golden, got, strict=False)):
        if want != have:
            return CanaryOutcome(
                False,
                f"canary token {i} of {len(golden)} is {have}, the golden token is {want} "
                f"(golden {list(golden)[: i + 1]}..., got {list(got)[: i + 1]}...)",
            )
    if len(got) != len(golden):
        return CanaryOutcome(
            False,
            f"canary gave {len(got)} tokens, the golden record has {len(golden)} "
            f"(the first {min(len(got), len(golden))} match)",
        )
    return CanaryOutcome(True, f"{len(golden)} greedy tokens equal the golden tokens")


def compare_text(golden: str, got: str) -> CanaryOutcome:
    """For a server that answers text (trtllm-serve's OpenAI routes): equal text."""
    if golden == got:
        return CanaryOutcome(True, f"greedy text equals the golden text ({len(golden)} characters)")
    i = next(
        (k for k, (a, b) in enumerate(zip(golden, got, strict=False)) if a != b), min(len(golden), len(got))
    )
    return CanaryOutcome(
        False,
        f"canary text differs from the golden text at character {i}: "
        f"{got[i : i + 20]!r} != {golden[i : i + 20]!r}",
    )
