"""The LLM canary: the server's greedy tokens for the canary prompt must equal the golden tokens that
the quantize step recorded with the checkpoint (temperature 0, a fixed number of tokens). A mismatch
means a wrong checkpoint, a wrong server build or broken numerics on this device: the pod stays
not ready and says which token differed.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtforge.contract.llm import GoldenTokens, golden_mismatch


@dataclass(frozen=True)
class CanaryOutcome:
    passed: bool
    message: str


def compare(golden: GoldenTokens, got: list[int]) -> CanaryOutcome:
    """Equal token for token, and as many (the contract's :func:`golden_mismatch` says where not)."""
    wrong = golden_mismatch(golden, got)
    if wrong is not None:
        return CanaryOutcome(False, wrong)
    return CanaryOutcome(True, f"{len(golden.tokens)} greedy tokens equal the golden tokens")


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
