"""``connector db upgrade``."""

from __future__ import annotations

import argparse

from connector.common.core import settings
from connector.common.store import migrate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--revision", default="head", help="target revision (default: head)")


def upgrade(args: argparse.Namespace) -> int:
    db = settings.load(settings.DatabaseSettings)
    url = db.conninfo()
    before = migrate.current(url)
    migrate.upgrade(url, args.revision)
    after = migrate.current(url)
    print(f"database schema: {before or 'empty'} -> {after}")
    return 0
