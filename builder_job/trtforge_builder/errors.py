"""The one exception the pipeline raises: a cause in one line, and its reason for the operator."""

from __future__ import annotations

from trtforge.contract.build_result import BUILD_EXIT_CODES, BuildFailure, FailureReason


class BuildError(Exception):
    """A build that cannot go on. `str(e)` is one line naming the cause (and the field or file)."""

    def __init__(self, message: str, reason: FailureReason, *, step: str | None = None) -> None:
        super().__init__(" ".join(message.split()) if "\n" in message else message)
        self.reason: FailureReason = reason
        self.step = step

    @property
    def exit_code(self) -> int:
        return BUILD_EXIT_CODES[self.reason]

    def failure(self, key: str | None = None) -> BuildFailure:
        return BuildFailure(
            error=str(self), reason=self.reason, exit_code=self.exit_code, key=key, step=self.step
        )
