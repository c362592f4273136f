"""Structured logging (one JSON object per line) that never prints payloads or secrets.

Callers pass fields through ``extra={...}``; any field whose name suggests sensitive content is
replaced by ``"[redacted]"`` before formatting, so a careless call cannot leak a body or a token.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

SENSITIVE = ("payload", "body", "secret", "token", "signature", "password", "authorization", "credential")
_STD = set(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "taskName"}


def _safe(key: str, value: Any) -> Any:
    if any(s in key.lower() for s in SENSITIVE):
        return "[redacted]"
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STD and not key.startswith("_"):
                out[key] = _safe(key, value)
        if record.exc_info and record.exc_info[0] is not None:
            # Exception *types* only: messages of driver errors can quote parameters.
            out["exc_type"] = record.exc_info[0].__name__
        return json.dumps(out, separators=(",", ":"))


def setup(service: str, level: str | None = None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel((level or os.environ.get("CONNECTOR_LOG_LEVEL", "INFO")).upper())
    for noisy in ("aiohttp.access", "alembic.runtime.migration"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
