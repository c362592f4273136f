"""Skews this process's wall clock by ``CONNECTOR_TEST_CLOCK_SKEW_S`` seconds (tests only).

Put this directory first on ``PYTHONPATH`` of a child process: ``time.time``, ``time.time_ns`` and
``datetime.now/utcnow/today`` then lie by the given offset, like a host whose clock is wrong. The
monotonic clock is untouched (a skewed wall clock does not change how fast time passes).
"""

from __future__ import annotations

import datetime as _dt
import os
import time as _time

_SKEW = float(os.environ.get("CONNECTOR_TEST_CLOCK_SKEW_S", "0") or 0)

if _SKEW:
    _real_time = _time.time
    _real_time_ns = _time.time_ns
    _delta = _dt.timedelta(seconds=_SKEW)

    def _time_skewed() -> float:
        return _real_time() + _SKEW

    def _time_ns_skewed() -> int:
        return _real_time_ns() + int(_SKEW * 1e9)

    _time.time = _time_skewed
    _time.time_ns = _time_ns_skewed

    class _SkewedDatetime(_dt.datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return super().now(tz) + _delta

        @classmethod
        def utcnow(cls):  # type: ignore[override]
            return super().utcnow() + _delta

        @classmethod
        def today(cls):  # type: ignore[override]
            return super().today() + _delta

    _dt.datetime = _SkewedDatetime  # type: ignore[misc]
