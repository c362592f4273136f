"""``connector retention sweep``: delete retired deliveries and expired admin request ids now (ADR 009).

The executor runs the same sweep every ``CONNECTOR_EXECUTOR_RETENTION_INTERVAL_S``; this command is for
operators (a first sweep of a large backlog, another period, a preview with ``--dry-run``). It takes
the same advisory lock as the executors' sweepers, so it never runs beside one (busy: exit 1).

Exit codes: 0 done, 1 database unavailable or another sweep holds the lock, 2 bad arguments (nothing
changed).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time

import psycopg

from connector.common.core import settings
from connector.common.maintenance import retention

_UNITS = {"s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0, "w": 604_800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
# Below this a provider's redelivery of a deleted delivery is likely (Stripe retries for 3 days).
_SHORT_S = 3 * 86_400.0


def parse_duration(text: str) -> float:
    """``90m``, ``12h``, ``7d``, ``2w``, ``45s`` -> seconds (> 0)."""
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(
            f"--older-than {text!r} is not a duration: a number and a unit s, m, h, d or w"
            " (e.g. 7d, 12h, 90m)"
        )
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds <= 0:
        raise ValueError("--older-than must be longer than 0")
    return seconds


def format_duration(seconds: float) -> str:
    for unit, size in (("d", 86_400.0), ("h", 3_600.0), ("m", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g}{unit}"
    return f"{seconds:.3g}s"


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--older-than",
        metavar="DURATION",
        help="delete retired deliveries accepted longer ago than this (7d, 12h, 90m; default:"
        " CONNECTOR_EXECUTOR_RETENTION_DELIVERED_S, 7 days)",
    )
    parser.add_argument("--dry-run", action="store_true", help="count what would be deleted; delete nothing")
    parser.add_argument(
        "--batch",
        metavar="N",
        help="receipts per chunk, one transaction each (default: CONNECTOR_EXECUTOR_RETENTION_BATCH, 1000)",
    )


def _kept(res: retention.SweepResult) -> str:
    return ", ".join(f"{reason} {res.kept[reason]}" for reason in retention.KEEP_REASONS if res.kept[reason])


def _progress(dry_run: bool) -> retention.Progress:
    verb = "would be deleted" if dry_run else "deleted"

    def report(res: retention.SweepResult) -> None:
        kept = sum(res.kept.values())
        line = (
            f"retention: chunk {res.chunks}: {res.receipts_scanned} receipts scanned,"
            f" {res.deliveries} deliveries {verb}, {kept} old deliveries kept"
        )
        if kept:
            line += f" ({_kept(res)})"
        print(line, file=sys.stderr, flush=True)

    return report


def sweep(args: argparse.Namespace) -> int:
    # Every argument is checked before anything touches the database.
    try:
        older_s = parse_duration(args.older_than) if args.older_than is not None else None
        batch = None
        if args.batch is not None:
            if not str(args.batch).strip().isdigit() or int(args.batch) < 1:
                raise ValueError(f"--batch {args.batch!r} must be a whole number >= 1")
            batch = int(args.batch)
    except ValueError as exc:
        print(f"connector retention sweep: {exc}", file=sys.stderr)
        return 2
    cfg = settings.load(settings.ExecutorSettings)
    url = settings.load(settings.DatabaseSettings).conninfo()
    delivered_s = older_s if older_s is not None else float(cfg.retention_delivered_s)
    admin_s = float(cfg.retention_admin_requests_s)
    batch = batch or int(cfg.retention_batch)
    if 0 < delivered_s < _SHORT_S:
        print(
            f"connector retention sweep: note: {format_duration(delivered_s)} is shorter than providers'"
            " redelivery windows (Stripe retries for 3 days); a redelivery of a deleted delivery is"
            " accepted as a new one",
            file=sys.stderr,
        )

    async def main() -> retention.SweepResult:
        conn = await retention.connect(url, "connector-retention-cli")
        try:
            if args.dry_run:
                return await retention.sweep(
                    conn,
                    delivered_s=delivered_s,
                    admin_requests_s=admin_s,
                    batch=batch,
                    dry_run=True,
                    progress=_progress(True),
                )
            return await retention.run_locked(
                conn,
                delivered_s=delivered_s,
                admin_requests_s=admin_s,
                batch=batch,
                progress=_progress(False),
            )
        finally:
            await conn.close()

    t0 = time.monotonic()
    try:
        res = asyncio.run(main())
    except psycopg.OperationalError as exc:
        print(f"connector retention sweep: database unavailable ({type(exc).__name__})", file=sys.stderr)
        return 1
    if res.result == "busy":
        print(
            "connector retention sweep: another sweep holds the retention lock (an executor's retention"
            " loop or another command); nothing done",
            file=sys.stderr,
        )
        return 1
    verb = "would delete" if args.dry_run else "deleted"
    d = res.deleted
    if delivered_s > 0:
        print(
            f"retention{' (dry run)' if args.dry_run else ''}: {verb} {res.deliveries} deliveries"
            f" accepted more than {format_duration(delivered_s)} ago ({d['connector_ingress_receipt']}"
            f" receipts, {d['connector_event']} events, {d['connector_work_item']} work items)"
        )
        kept = sum(res.kept.values())
        print(
            f"  scanned {res.receipts_scanned} receipts in {res.chunks} chunks;"
            f" kept {kept} old deliveries" + (f": {_kept(res)}" if kept else "")
        )
    else:
        print("retention: deliveries are kept forever (CONNECTOR_EXECUTOR_RETENTION_DELIVERED_S=0)")
    if admin_s > 0:
        print(
            f"  {verb} {d['connector_admin_request']} admin request ids older than {format_duration(admin_s)}"
        )
    else:
        print("  admin request ids are kept forever (CONNECTOR_EXECUTOR_RETENTION_ADMIN_REQUESTS_S=0)")
    print(
        f"  oldest receipt left: {format_duration(res.oldest_receipt_age_s)} old;"
        f" {time.monotonic() - t0:.1f}s"
    )
    return 0
