"""Text helpers for status messages (written for people; no decision reads them back)."""

from __future__ import annotations

import datetime as dt

from trtforge_operator.observe.views import utc


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line, cut to `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def iso_time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp(epoch: float | None) -> dt.datetime | None:
    return utc(epoch) if epoch else None
