"""Structured logging (one JSON object per line) that never prints payloads or secrets.

Callers pass fields through ``extra={...}``; any field whose name suggests sensitive content is
replaced by ``"[redacted]"`` before formatting, so a careless call cannot leak a body or a token.
"""

from __future__ import annotations

import json
import logging
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


class TextFormatter(logging.Formatter):
    """One readable line: ``HH:MM:SS LEVEL service message key=value ...`` (UTC; the same fields and
    redaction as the JSON lines)."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.gmtime(record.created))
        fields = [
            f"{key}={_text(_safe(key, value))}"
            for key, value in record.__dict__.items()
            if key not in _STD and not key.startswith("_") and value is not None
        ]
        if record.exc_info and record.exc_info[0] is not None:
            fields.append(f"exc_type={record.exc_info[0].__name__}")
        # ``connector up`` runs every service in one process: the logger's package names the service.
        parts = record.name.split(".")
        who = parts[1] if len(parts) > 1 and parts[0] == "connector" else self.service
        head = f"{stamp} {record.levelname:<7} {who:<12} {record.getMessage()}"
        return "  ".join([head, " ".join(fields)]) if fields else head


def _text(value: Any) -> str:
    text = str(value)
    return json.dumps(text) if (not text or any(c in text for c in ' "=\n')) else text


#: One INFO line per accepted delivery at the ingress (``CONNECTOR_LOG_DELIVERIES``; set by ``setup``).
DELIVERIES = False


def setup(
    service: str,
    level: str | None = None,
    *,
    text: bool = False,
    deliveries: bool = False,
) -> None:
    """Log to stderr for ``service``. ``level``, ``text`` and ``deliveries`` are the command's
    defaults; ``CONNECTOR_LOG_LEVEL``, ``CONNECTOR_LOG_FORMAT`` and ``CONNECTOR_LOG_DELIVERIES``
    (``settings.LogSettings``) win over them."""
    from connector.common.core.settings import LogSettings, load

    global DELIVERIES
    cfg = load(LogSettings)
    handler = logging.StreamHandler(sys.stderr)
    fmt = cfg.format or ("text" if text else "json")
    handler.setFormatter(TextFormatter(service) if fmt == "text" else JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(cfg.level or (level or "INFO").upper())
    DELIVERIES = deliveries if cfg.deliveries is None else cfg.deliveries
    for noisy in ("aiohttp.access", "alembic.runtime.migration"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
