"""Text helpers for status messages (written for people; no decision reads them back)."""

from __future__ import annotations

import datetime as dt

from trtforge_operator.observe.views import one_line as one_line  # the one copy, beside the views
from trtforge_operator.observe.views import utc


def iso_time(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def timestamp(epoch: float | None) -> dt.datetime | None:
    return utc(epoch) if epoch else None
