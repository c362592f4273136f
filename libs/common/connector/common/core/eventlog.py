"""Operator events as structured INFO lines, rate-limited per (event, reason) so a flood cannot
flood the log.

One ``EventLog`` per service (``events("ingress")``). ``emit(event, reason, **fields)`` writes one
JSON line (``connector.common.core.logs``: sensitive field names are redacted there as everywhere) while
the key's token bucket has a token: ``burst`` lines at once, refilled at ``rate_per_s``. Past that a
line is not written but counted: ``connector_log_lines_suppressed_total{service,event,reason}``
(shared code's registry, ``connector.common.core.metrics.SHARED``), and one summary line per
``summary_s`` per key says how many were dropped (``msg="log lines suppressed"``, ``suppressed=N``)
— written by a timer started on the first suppressed line of an interval, so a flood that stops is
still summarised, and ``flush()`` (on shutdown) writes any pending summary at once.

Callers emit only on refusal / failure / operator paths, never per success. Every value a stranger
can choose (a request id, a peer address) goes through ``safe_token`` or ``safe_peer`` first:
bounded length, a safe character set; anything else is replaced, never echoed.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from prometheus_client import Counter

from connector.common.core.metrics import SHARED

SUPPRESSED = Counter(
    "connector_log_lines_suppressed_total",
    "Event log lines not written by the per-(event, reason) rate limit (a summary line says how many)",
    ["service", "event", "reason"],
    registry=SHARED,
)

#: A token a client may choose (request id): visible ASCII without quotes, spaces or separators.
TOKEN_RE: Final = re.compile(r"[A-Za-z0-9._:@/+=-]{1,64}")
MAX_TOKEN: Final = 64
#: Longest ``reason`` label kept (reasons come from fixed vocabularies; this bounds a mistake).
MAX_REASON: Final = 64

_PREFIX = secrets.token_hex(4)
_IDS = itertools.count(1)


def new_request_id() -> str:
    """A process-unique request id (random process prefix + counter): cheap enough per request."""
    return f"{_PREFIX}-{next(_IDS):x}"


def safe_token(value: str | None) -> str | None:
    """``value`` if it is a bounded token of the safe charset (``TOKEN_RE``), else ``None``."""
    if value is not None and len(value) <= MAX_TOKEN and TOKEN_RE.fullmatch(value):
        return value
    return None


def safe_peer(value: str | None) -> str:
    """An IP address in canonical form, or ``"invalid"`` (a port, a name or junk never passes)."""
    if not value:
        return "unknown"
    text = value.strip()
    if len(text) > 64:
        return "invalid"
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return "invalid"


class _Bucket:
    __slots__ = ("pending", "stamp", "timer", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp
        self.pending = 0
        self.timer: threading.Timer | None = None


class EventLog:
    def __init__(
        self,
        service: str,
        *,
        logger: str | None = None,
        burst: int = 20,
        rate_per_s: float = 1.0,
        summary_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.log = logging.getLogger(logger or f"connector.{service}.events")
        self.burst = burst
        self.rate_per_s = rate_per_s
        self.summary_s = summary_s
        self._clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._lock = threading.Lock()
        #: Lines written and suppressed since start (tests, and ``flush``'s report).
        self.written = 0
        self.suppressed = 0

    def emit(self, event: str, reason: str, msg: str | None = None, **fields: Any) -> bool:
        """One INFO line ``msg`` (default ``event``) with ``event``, ``reason`` and ``fields``, unless
        the key's bucket is empty (then counted and summarised). Returns whether it was written."""
        reason = reason[:MAX_REASON]
        key = (event, reason)
        with self._lock:
            now = self._clock()
            b = self._buckets.get(key)
            if b is None:
                b = self._buckets[key] = _Bucket(float(self.burst), now)
            else:
                b.tokens = min(float(self.burst), b.tokens + (now - b.stamp) * self.rate_per_s)
                b.stamp = now
            if b.tokens >= 1.0:
                b.tokens -= 1.0
                self.written += 1
                allowed = True
            else:
                b.pending += 1
                self.suppressed += 1
                allowed = False
                if b.timer is None and self.summary_s > 0:
                    b.timer = threading.Timer(self.summary_s, self._summarise, (key,))
                    b.timer.daemon = True
                    b.timer.start()
        if allowed:
            self.log.info(msg or event, extra={"event": event, "reason": reason, **fields})
        else:
            SUPPRESSED.labels(self.service, event, reason).inc()
        return allowed

    def _summarise(self, key: tuple[str, str]) -> None:
        with self._lock:
            b = self._buckets.get(key)
            if b is None:
                return
            n, b.pending, b.timer = b.pending, 0, None
        if n:
            self.log.info(
                "log lines suppressed",
                extra={"event": key[0], "reason": key[1], "suppressed": n, "interval_s": self.summary_s},
            )

    def flush(self) -> None:
        """Write every pending summary now (and cancel its timer): on shutdown, and in tests."""
        with self._lock:
            keys = list(self._buckets)
            for k in keys:
                t = self._buckets[k].timer
                if t is not None:
                    t.cancel()
        for k in keys:
            self._summarise(k)


_EVENTS: dict[str, EventLog] = {}
_EVENTS_LOCK = threading.Lock()


def events(service: str) -> EventLog:
    """The process's event log of ``service`` (made on first use with the default limits)."""
    ev = _EVENTS.get(service)
    if ev is None:
        with _EVENTS_LOCK:
            ev = _EVENTS.setdefault(service, EventLog(service))
    return ev
