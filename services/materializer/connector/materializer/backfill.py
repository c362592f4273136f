"""``connector materializer backfill``: the CLI of ``connector.common.delivery.backfill``."""

from __future__ import annotations

import argparse
import asyncio
import sys

import psycopg

from connector.common.core import logs, settings
from connector.common.delivery.backfill import BackfillReport, backfill


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pack-id", type=int, default=None, help="only this installed pack id")
    parser.add_argument("--generation", type=int, default=None, help="only this generation")
    parser.add_argument("--batch", type=int, default=500, help="events per transaction (default 500)")
    parser.add_argument("--dry-run", action="store_true", help="count what would be created; create nothing")


def cli(args: argparse.Namespace) -> int:
    logs.setup("materializer")
    db = settings.load(settings.DatabaseSettings)

    async def main() -> BackfillReport:
        async with await psycopg.AsyncConnection.connect(db.conninfo(), autocommit=True) as conn:
            return await backfill(
                conn,
                installed_pack_id=args.pack_id,
                generation=args.generation,
                batch=max(1, args.batch),
                dry_run=args.dry_run,
            )

    try:
        report = asyncio.run(main())
    except psycopg.OperationalError as exc:
        print(f"database unavailable ({type(exc).__name__})", file=sys.stderr)
        return 1
    verb = "would create" if args.dry_run else "created"
    print(f"backfill: {verb} {report.work_items} work items for {report.events} events")
    for cls, n in sorted(report.failed.items()):
        print(f"  not backfilled ({cls}): {n} events")
    for reason, n in report.ineligible.items():
        print(f"  ineligible ({reason}): {n} events without work items")
    return 0 if not report.failed else 3
