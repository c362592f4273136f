"""Dead letters write one INFO line each (work id, event id, pack, work type, failure class, attempt;
never the payload or the summary), rate-limited per failure class, with a control."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from connector.common.core import eventlog, logs
from connector.common.core.eventlog import EventLog
from tests.executor import seed
from tests.executor.helpers import await_for, states

PLANTED = b'{"card": "4242424242424242", "name": "Mallory-planted"}'


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logs.JsonFormatter("executor"))
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(self.format(record))

    def parsed(self, msg: str) -> list[dict[str, object]]:
        return [x for x in map(json.loads, self.text) if x["msg"] == msg]


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("connector.t.executor.events")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)


def _events(monkeypatch: pytest.MonkeyPatch, **kw: float) -> EventLog:
    ev = EventLog("executor", logger="connector.t.executor.events", summary_s=0, **kw)  # type: ignore[arg-type]
    monkeypatch.setitem(eventlog._EVENTS, "executor", ev)
    return ev


async def test_one_line_per_dead_letter_and_none_for_successes(
    db, executor_factory, lines, monkeypatch
) -> None:
    _events(monkeypatch)
    pack = seed.seed_pack(
        db,
        "p",
        {
            "bad": seed.python_work_type("tests.executor.effects:permanent"),
            "ok": seed.python_work_type("tests.executor.effects:noop"),
        },
    )
    dead = seed.seed_items(db, pack, 3, work_type="bad", body=PLANTED)
    seed.seed_items(db, pack, 5, work_type="ok", body=PLANTED)
    await executor_factory()
    await await_for(lambda: states(db) == {"dead": 3, "succeeded": 5}, 20, "terminal")
    await await_for(lambda: len(lines.parsed("work item dead-lettered")) == 3, 10, "dead-letter lines")
    got = lines.parsed("work item dead-lettered")
    assert sorted(int(x["work_id"]) for x in got) == sorted(dead)  # type: ignore[call-overload]
    events = dict(db.execute("SELECT work_id, event_id FROM connector_work_item").fetchall())
    for x in got:
        assert x["level"] == "info" and x["event"] == "dead_letter" and x["reason"] == "validation"
        assert x["work_type"] == "bad" and x["attempt"] == 1 and x["event_id"] == events[x["work_id"]]
    assert len(lines.text) == 3  # the successes wrote nothing
    text = "\n".join(lines.text)
    assert "4242424242424242" not in text and "Mallory" not in text


@pytest.mark.parametrize("limited", [True, False])
async def test_a_dead_letter_flood_is_bounded(db, executor_factory, lines, monkeypatch, limited) -> None:
    n = 40
    ev = _events(monkeypatch, burst=5, rate_per_s=0.0) if limited else _events(monkeypatch, burst=10**9)
    pack = seed.seed_pack(db, "p", {"bad": seed.python_work_type("tests.executor.effects:permanent")})
    seed.seed_items(db, pack, n, work_type="bad")
    await executor_factory()
    await await_for(lambda: states(db) == {"dead": n}, 20, "dead")
    await await_for(lambda: ev.written + ev.suppressed == n, 10, "every dead letter seen")
    got = lines.parsed("work item dead-lettered")
    if limited:
        assert len(got) == 5 and ev.suppressed == n - 5
        ev.flush()
        [summary] = lines.parsed("log lines suppressed")
        assert summary["suppressed"] == n - 5 and summary["reason"] == "validation"
    else:  # control: every dead letter is a line without the limit
        assert len(got) == n and ev.suppressed == 0
