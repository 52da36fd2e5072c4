"""The two kinds the operator reconciles, as one enum (never bare strings)."""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    """A reconciled kind. The value is its kubectl short name, which is also the `kind` label of the
    operator's metrics (trtforge_reconciles_total, trtforge_status_writes_total)."""

    TRTENGINE = "trte"
    INFERENCEDEPLOYMENT = "infd"
