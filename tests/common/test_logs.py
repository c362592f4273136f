"""``connector.common.core.logs``: JSON or text lines, the level and the per-delivery lines chosen by
``CONNECTOR_LOG_*`` over each command's defaults, the same redaction in both formats."""

from __future__ import annotations

import logging

import pytest

from connector.common.core import logs
from connector.common.core.settings import SettingsError


@pytest.fixture(autouse=True)
def _restore_root() -> object:
    root = logging.getLogger()
    handlers, level, deliveries = root.handlers[:], root.level, logs.DELIVERIES
    yield None
    root.handlers[:] = handlers
    root.setLevel(level)
    logs.DELIVERIES = deliveries


def _formatter() -> logging.Formatter:
    handler = logging.getLogger().handlers[0]
    assert handler.formatter is not None
    return handler.formatter


def test_the_command_defaults_apply_when_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("CONNECTOR_LOG_LEVEL", "CONNECTOR_LOG_FORMAT", "CONNECTOR_LOG_DELIVERIES"):
        monkeypatch.delenv(name, raising=False)
    logs.setup("ingress")  # a service: JSON at INFO, no per-delivery lines
    assert isinstance(_formatter(), logs.JsonFormatter) and logging.getLogger().level == logging.INFO
    assert logs.DELIVERIES is False
    logs.setup("up", "INFO", text=True, deliveries=True)  # connector up
    assert isinstance(_formatter(), logs.TextFormatter) and logs.DELIVERIES is True


def test_the_variables_win_over_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONNECTOR_LOG_LEVEL", "warning")
    monkeypatch.setenv("CONNECTOR_LOG_FORMAT", "JSON")
    monkeypatch.setenv("CONNECTOR_LOG_DELIVERIES", "false")
    logs.setup("up", "INFO", text=True, deliveries=True)
    assert isinstance(_formatter(), logs.JsonFormatter)
    assert logging.getLogger().level == logging.WARNING and logs.DELIVERIES is False
    monkeypatch.setenv("CONNECTOR_LOG_FORMAT", "xml")
    with pytest.raises(SettingsError) as exc:
        logs.setup("up")
    assert "CONNECTOR_LOG_FORMAT" in str(exc.value)


def test_a_text_line_is_readable_and_redacted() -> None:
    record = logging.LogRecord(
        "connector.ingress.deliveries", logging.INFO, "x", 1, "delivery accepted", (), None
    )
    record.receipt_id = 12
    record.route = "events"
    record.summary = "two words"
    record.payload = "must-not-appear"
    record.missing = None
    line = logs.TextFormatter("up").format(record)
    assert line.endswith(
        'delivery accepted  receipt_id=12 route=events summary="two words" payload=[redacted]'
    )
    assert " INFO    ingress " in line and "must-not-appear" not in line and "missing" not in line
