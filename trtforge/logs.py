"""Structured logs: one JSON object per line (machines) or `time level logger: msg key=value` (people).

Use ``log.info("engine published", extra=fields(key=k, seconds=1.2))``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

_FIELDS = "trtforge_fields"


def fields(**kv: Any) -> dict[str, Any]:
    """Extra key/value pairs for one log record."""
    return {_FIELDS: kv}


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(getattr(record, _FIELDS, {}))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%H:%M:%S", time.localtime(record.created))
        kv = " ".join(f"{k}={v}" for k, v in getattr(record, _FIELDS, {}).items())
        line = f"{ts} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if kv:
            line = f"{line}  {kv}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def configure_logging(level: str = "INFO", fmt: str | None = None) -> None:
    """Configure the root logger once; `fmt` defaults to $TRTFORGE_LOG_FORMAT, else json off a tty."""
    fmt = fmt or os.environ.get("TRTFORGE_LOG_FORMAT") or ("text" if sys.stderr.isatty() else "json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
