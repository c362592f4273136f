"""Output helpers of ``connector admin``: plain-text tables, JSON, durations, a progress bar."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from connector.v1 import types_pb2

CELL_MAX = 48


def to_json(message: Message) -> str:
    return json.dumps(
        MessageToDict(message, preserving_proto_field_name=True),
        indent=2,
        sort_keys=True,
    )


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    text = text.replace("\n", " ")
    return text if len(text) <= CELL_MAX else text[: CELL_MAX - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO | None = None) -> None:
    """Columns padded to their widest cell; long cells are cut (use --json for full values)."""
    out = out or sys.stdout
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    line = "  ".join(h.upper().ljust(widths[i]) for i, h in enumerate(headers)).rstrip()
    print(line, file=out)
    for row in cells:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip(), file=out)
    if not rows:
        print("(none)", file=out)


def process_table(response: Any, out: TextIO | None = None) -> None:
    """``connector admin processes``: one row per registered process, by service then host and pid."""
    rows = sorted(response.processes, key=lambda p: (p.service, p.hostname, p.pid, p.process_id))
    table(
        [
            "service",
            "process_id",
            "host",
            "pid",
            "version",
            "revision",
            "capability",
            "heartbeat_age",
            "stale",
        ],
        [
            (
                p.service,
                p.process_id,
                p.hostname,
                p.pid,
                p.version,
                p.revision[:12] or "-",
                p.claim_capability,
                age(p.heartbeat_age, p.HasField("heartbeat_age")),
                "yes" if p.stale else "",
            )
            for p in rows
        ],
        out,
    )
    if rows and response.HasField("stale_after"):
        stale = sum(1 for p in rows if p.stale)
        print(
            f"{len(rows)} process{'' if len(rows) == 1 else 'es'}, {stale} stale"
            f" (no heartbeat for {age(response.stale_after)})",
            file=out or sys.stdout,
        )


def timestamp(value: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(value)
    return out


def when(ts: Timestamp, present: bool = True) -> str:
    if not present or (ts.seconds == 0 and ts.nanos == 0):
        return "-"
    return ts.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(ts: Timestamp, present: bool = True) -> str:
    if not present or (ts.seconds == 0 and ts.nanos == 0):
        return "-"
    seconds = (datetime.now(UTC) - ts.ToDatetime(tzinfo=UTC)).total_seconds()
    return human_seconds(seconds) + " ago"


def age(d: Duration, present: bool = True) -> str:
    if not present:
        return "-"
    return human_seconds(d.ToTimedelta().total_seconds())


def human_seconds(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def enum_name(value: str, prefix: str) -> str:
    return value.removeprefix(prefix).lower() if value else "-"


class Progress:
    """A bar on a TTY (redrawn in place), otherwise one line every ``interval_s`` (and the last)."""

    def __init__(self, out: TextIO | None = None, *, interval_s: float = 2.0, width: int = 30) -> None:
        self.out = out or sys.stderr
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self.interval_s = interval_s
        self.width = width
        self._last = 0.0
        self._drawn = False

    def update(self, done: int, total: int, refused: int, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and not self.tty and now - self._last < self.interval_s:
            return
        self._last = now
        text = f"{done + refused}/{total} processed: {done} replayed, {refused} refused"
        if self.tty:
            filled = self.width if total == 0 else int(self.width * (done + refused) / total)
            bar = "#" * filled + "." * (self.width - filled)
            self.out.write(f"\r[{bar}] {text}")
            self._drawn = True
            if final:
                self.out.write("\n")
                self._drawn = False
        else:
            self.out.write(f"replay: {text}\n")
        self.out.flush()

    def close(self) -> None:
        if self.tty and self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False


def work_item_state(value: int) -> str:
    """A ``WorkItemState`` as the CLI prints it (``dead``, ``awaiting_legacy_outcome``)."""
    return enum_name(types_pb2.WorkItemState.Name(value), "WORK_ITEM_STATE_")


def emit(args: argparse.Namespace, message: Message, render: Callable[[], None]) -> None:
    if args.json:
        print(to_json(message))
    else:
        render()
