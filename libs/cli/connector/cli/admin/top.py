"""``connector admin top``: the cluster's figures per pack and in total, refreshed like ``top``
(GetFigures with ``current_only``: one bounded read per refresh; docs/admin.md).

On a terminal it redraws one screen every ``--interval`` seconds until ``q`` or Ctrl-C (the
terminal is restored either way); when the output is not a terminal it prints one frame per
refresh, one after another (like ``top -b``). ``--once`` prints one frame and exits; ``--json``
prints the API response instead (with ``--once`` one document, else one line per refresh).

Rates are over the last minute or so (the previous and the current minute: ``FiguresSeries.current``);
the gauges are the newest sample. A call that fails while refreshing is shown in the frame and
retried at the next refresh; with ``--once`` it is the command's error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sys
import time
from collections.abc import Iterator
from datetime import UTC
from typing import Any, TextIO

import grpc
from google.protobuf.json_format import MessageToDict

from connector.cli.admin.client import Client, CliError, format_error, resolve_pack_id
from connector.cli.admin.output import human_seconds, table, to_json
from connector.v1 import admin_service_pb2 as pb

HEADERS = (
    "pack", "acc/s", "ref/s", "exec/s", "fail/s", "dead/s", "ack p50", "ack p99",
    "deliv p50", "deliv p99", "delay p95", "backlog", "in_flight", "oldest", "circ", "paused",
)  # fmt: skip

_CLEAR = "\x1b[H\x1b[2J"
_ENTER = "\x1b[?1049h\x1b[?25l"  # alternate screen, cursor hidden
_LEAVE = "\x1b[?25h\x1b[?1049l"


def add_command(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    text = (
        "live view of the cluster's throughput and latency per pack (like top): answers, executions,"
        " failures and dead letters per second, ack / delivery latency, scheduling delay, backlog,"
        " circuits and pauses; q or Ctrl-C quits"
    )
    p = groups.add_parser("top", parents=[common], help=text, description=text)
    p.set_defaults(admin_run=top)
    p.add_argument("--pack", help="only this pack (id or name); the total is always shown")
    p.add_argument(
        "--interval", type=float, default=2.0, help="seconds between refreshes (default 2, at least 0.5)"
    )
    p.add_argument(
        "--once", action="store_true", help="print one frame (or, with --json, one document) and exit"
    )


def _seconds(d: Any, present: bool) -> float | None:
    return d.seconds + d.nanos / 1e9 if present else None


def latency(d: Any, present: bool = True) -> str:
    """A latency for a narrow column: 0.4ms, 12ms, 1.5s, 2m."""
    s = _seconds(d, present)
    if s is None:
        return "-"
    if s < 0.01:
        return f"{s * 1000:.1f}ms"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 60:
        return f"{s:.1f}s"
    return human_seconds(s)


def _rate(n: int, seconds: float) -> str:
    if seconds <= 0:
        return "-"
    r = n / seconds
    return f"{r:.0f}" if r >= 100 else f"{r:.1f}" if r >= 1 else f"{r:.2f}" if r > 0 else "0"


def _q(point: pb.FiguresPoint, name: str, which: str) -> str:
    if not point.HasField(name):
        return "-"
    q = getattr(point, name)
    return latency(getattr(q, which), q.HasField(which))


def row(series: pb.FiguresSeries) -> tuple[Any, ...]:
    c = series.current
    s = c.seconds
    g = c.gauges
    has = c.HasField("gauges")
    name = "TOTAL" if series.installed_pack_id == 0 else f"{series.pack_name} ({series.installed_pack_id})"
    return (
        name,
        _rate(c.accepted, s),
        _rate(c.rejected + c.unavailable, s),
        _rate(c.executed, s),
        _rate(c.failed, s),
        _rate(c.dead_lettered, s),
        _q(c, "ack_latency", "p50"),
        _q(c, "ack_latency", "p99"),
        _q(c, "delivery_latency", "p50"),
        _q(c, "delivery_latency", "p99"),
        _q(c, "scheduling_delay", "p95"),
        g.backlog if has else "-",
        g.in_flight if has else "-",
        latency(g.oldest_ready_age, has and g.HasField("oldest_ready_age")),
        g.open_circuits if has else "-",
        g.pauses if has else "-",
    )


def frame(response: pb.GetFiguresResponse, out: TextIO) -> None:
    """One screen: a header line, the cluster's state, then the table (total first)."""
    end = response.end_time.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S")
    cluster = next((s for s in response.series if s.installed_pack_id == 0), None)
    seconds = cluster.current.seconds if cluster is not None else 0.0
    print(f"connector top  {end} UTC (database clock)  rates over the last {seconds:.0f} s", file=out)
    if cluster is not None and cluster.current.HasField("gauges"):
        g = cluster.current.gauges
        unrouted = latency(g.oldest_unrouted_age, g.HasField("oldest_unrouted_age"))
        print(
            f"executors {g.active_executors}  ingress {g.ingress_processes}  receipts unrouted"
            f" {g.receipts_unrouted} (oldest {unrouted})  backlog {g.backlog}  in flight {g.in_flight}"
            f"  circuits open {g.open_circuits}  pauses {g.pauses}",
            file=out,
        )
    else:
        print("no gauge sample yet (an executor samples every CONNECTOR_EXECUTOR_STATS_INTERVAL_S)", file=out)
    print(file=out)
    table(HEADERS, [row(s) for s in response.series], out)


def _fetch(client: Client, packs: list[int]) -> pb.GetFiguresResponse:
    request = pb.GetFiguresRequest(installed_pack_ids=packs, current_only=True)
    response: pb.GetFiguresResponse = client.call("GetFigures", request)
    return response


@contextlib.contextmanager
def _screen(out: TextIO) -> Iterator[Any]:
    """The alternate screen with keys read one at a time (``q`` quits); restored on exit."""
    fd = None
    saved = None
    try:
        import termios
        import tty

        if sys.stdin.isatty():
            fd = sys.stdin.fileno()
            saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)
    except (ImportError, OSError):
        fd = None
    out.write(_ENTER)
    out.flush()
    try:
        yield fd
    finally:
        out.write(_LEAVE)
        out.flush()
        if fd is not None and saved is not None:
            import termios

            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait(fd: int | None, seconds: float) -> bool:
    """Sleep up to ``seconds``; True when ``q`` was pressed."""
    if fd is None:
        time.sleep(seconds)
        return False
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if ready and os.read(fd, 1) in (b"q", b"Q"):
            return True
    return False


def top(client: Client, args: argparse.Namespace) -> int:
    if args.interval < 0.5:
        raise CliError("--interval must be at least 0.5 seconds")
    packs = [resolve_pack_id(client, args.pack)] if args.pack else []
    out = sys.stdout
    if args.once:
        once = _fetch(client, packs)
        if args.json:
            print(to_json(once), file=out)
        else:
            frame(once, out)
        return 0
    live = out.isatty() and not args.json
    screen = _screen(out) if live else contextlib.nullcontext(None)
    with screen as fd:
        while True:
            response: pb.GetFiguresResponse | None = None
            error: str | None = None
            try:
                response = _fetch(client, packs)
            except grpc.RpcError as exc:
                error = format_error(exc)
            if args.json:
                if response is not None:
                    doc = MessageToDict(response, preserving_proto_field_name=True)
                    print(json.dumps(doc, sort_keys=True), file=out, flush=True)
                else:
                    print(error, file=sys.stderr, flush=True)
            else:
                if live:
                    out.write(_CLEAR)
                if response is not None:
                    frame(response, out)
                if error is not None:
                    print(f"\n{error} (retrying every {args.interval:g} s)", file=out)
                if live:
                    print("\nq: quit", file=out)
                else:
                    print(file=out)
                out.flush()
            if _wait(fd, args.interval):
                return 0
