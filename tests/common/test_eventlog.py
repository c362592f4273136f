"""The rate-limited event log: lines up to the bucket, the rest counted and summarised."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator

import pytest

from connector.common.core import eventlog, logs
from connector.common.core.eventlog import SUPPRESSED, EventLog, safe_peer, safe_token


class Lines(logging.Handler):
    """Formats each record as the services do (JSON) and keeps the parsed lines."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logs.JsonFormatter("test"))
        self.lines: list[dict[str, object]] = []
        self.summary = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        line = json.loads(self.format(record))
        self.lines.append(line)
        if line["msg"] == "log lines suppressed":
            self.summary.set()


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("connector.t.events")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _suppressed(event: str, reason: str) -> float:
    return SUPPRESSED.labels("t", event, reason)._value.get()


def test_flood_is_bounded_by_the_bucket_and_the_rest_is_counted(lines: Lines) -> None:
    clock = Clock()
    ev = EventLog("t", logger="connector.t.events", burst=5, rate_per_s=1.0, summary_s=0, clock=clock)
    before = _suppressed("refused", "flood")
    n = 1000
    for _ in range(n):
        ev.emit("refused", "flood", peer="127.0.0.1")
    refused = [x for x in lines.lines if x["msg"] == "refused"]
    assert len(refused) == 5
    assert ev.suppressed == n - 5 and _suppressed("refused", "flood") - before == n - 5
    # Another reason has its own bucket; the clock refills the first one at rate_per_s.
    ev.emit("refused", "other")
    clock.t += 2.0
    assert ev.emit("refused", "flood") and ev.emit("refused", "flood") and not ev.emit("refused", "flood")
    assert [x["reason"] for x in lines.lines].count("other") == 1
    ev.flush()
    summary = [x for x in lines.lines if x["msg"] == "log lines suppressed"]
    assert summary == [summary[0]] and summary[0]["suppressed"] == n - 5 + 1
    assert summary[0]["event"] == "refused" and summary[0]["reason"] == "flood"


def test_control_without_a_limit_every_line_is_written(lines: Lines) -> None:
    ev = EventLog("t", logger="connector.t.events", burst=10**9, rate_per_s=0, summary_s=0)
    for _ in range(1000):
        ev.emit("refused", "control")
    assert len([x for x in lines.lines if x["reason"] == "control"]) == 1000 and ev.suppressed == 0


def test_the_timer_writes_one_summary_per_interval(lines: Lines) -> None:
    ev = EventLog("t", logger="connector.t.events", burst=1, rate_per_s=0, summary_s=0.2)
    for _ in range(50):
        ev.emit("dead_letter", "timer")
    assert lines.summary.wait(10), "no summary line"
    summaries = [x for x in lines.lines if x["msg"] == "log lines suppressed"]
    assert len(summaries) == 1 and summaries[0]["suppressed"] == 49
    ev.flush()  # nothing pending: no second summary
    assert len([x for x in lines.lines if x["msg"] == "log lines suppressed"]) == 1


def test_sanitizers_bound_client_values() -> None:
    assert safe_token("req-123_abc.DEF") == "req-123_abc.DEF"
    for bad in ("", "a" * 65, "a b", 'x"y', "x\ny", "é", "a;b", "<script>"):
        assert safe_token(bad) is None
    assert safe_peer("127.0.0.1") == "127.0.0.1"
    assert safe_peer(" ::FFFF:10.0.0.1 ") == "::ffff:a00:1"
    assert safe_peer("[::1]") == "::1"
    assert safe_peer("evil\n{json}") == "invalid" and safe_peer("1" * 200) == "invalid"
    assert safe_peer(None) == "unknown"
    a, b = eventlog.new_request_id(), eventlog.new_request_id()
    assert a != b and safe_token(a) == a
