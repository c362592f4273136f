"""``connector pack apply FILE [--activate] [--dry-run]``: install a pack manifest.

Validates the whole manifest first: when anything is wrong every error is printed (one per line,
``path: message``), nothing is installed and the exit code is 2. A valid manifest is installed as a
new generation (``connector.common.packs.install.pack_apply``) and a summary is printed: pack,
generation, status, and each route with its version and whether it changed. ``--dry-run`` does the
same inside a transaction that is rolled back, so it shows exactly what an apply would install.
Exit codes: 0 installed (or dry run passed), 1 database unavailable, 2 invalid or refused.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from pathlib import Path
from typing import TextIO

import psycopg

from connector.common.core import settings
from connector.common.packs import install
from connector.common.packs.document import ManifestError, parse_manifest
from connector.common.packs.manifest import Manifest

EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_INVALID = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="manifest file (YAML or JSON); '-' reads standard input")
    parser.add_argument("--activate", action="store_true", help="activate the new generation at once")
    parser.add_argument(
        "--dry-run", action="store_true", help="validate and show what would be installed; install nothing"
    )
    parser.add_argument("--actor", default=None, help="who applies (recorded on the install receipt)")


def apply(args: argparse.Namespace) -> int:
    out: TextIO = sys.stdout
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    except OSError as exc:
        print(f"error: cannot read {args.file}: {exc.strerror or type(exc).__name__}", file=sys.stderr)
        return EXIT_INVALID
    except UnicodeDecodeError:
        print(f"error: cannot read {args.file}: not UTF-8 text", file=sys.stderr)
        return EXIT_INVALID
    try:
        manifest = parse_manifest(text)
    except ManifestError as exc:
        print(f"invalid pack manifest {args.file} ({len(exc.errors)} errors); nothing installed:", file=out)
        for error in exc.errors:
            print(f"  - {error}", file=out)
        return EXIT_INVALID
    db = settings.load(settings.DatabaseSettings)
    actor = args.actor or f"cli:{getpass.getuser()}"
    try:
        run = _apply(db.conninfo(), manifest, activate=args.activate, dry_run=args.dry_run, actor=actor)
        return asyncio.run(run)
    except psycopg.OperationalError as exc:
        print(f"database unavailable ({type(exc).__name__}); nothing installed", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except psycopg.DataError as exc:
        # A value the database cannot store that validation let through (it checks NUL characters,
        # lone surrogates, nesting): refused as invalid, without a traceback; the transaction rolled back.
        print(f"refused by the database ({type(exc).__name__}); nothing installed", file=sys.stderr)
        return EXIT_INVALID


async def _apply(url: str, manifest: Manifest, *, activate: bool, dry_run: bool, actor: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        try:
            async with conn.transaction(force_rollback=dry_run):
                applied = await install.pack_apply(conn, manifest, activate=activate, actor=actor)
        except install.PackStoreError as exc:
            print(f"refused: {exc.message}; nothing installed")
            return EXIT_INVALID
    print(summary(applied, dry_run=dry_run))
    return EXIT_OK


def summary(applied: install.AppliedPack, *, dry_run: bool = False) -> str:
    if applied.created_generation:
        what = f"generation {applied.generation} {'would be ' if dry_run else ''}installed"
    else:
        what = f"generation {applied.generation} unchanged (same manifest as the latest generation)"
    lines = [
        f"pack {applied.name} (namespace {applied.namespace}, id {applied.installed_pack_id}): {what}, "
        f"status {applied.status}" + (" — dry run, nothing installed" if dry_run else ""),
    ]
    width = max((len(r.route_key) for r in applied.routes), default=0)
    for route in applied.routes:
        lines.append(f"  route {route.route_key:<{width}}  version {route.route_version} ({route.change})")
    if applied.status == "staged" and not dry_run:
        lines.append(
            f"  activate with: connector pack apply FILE --activate (or the admin API ActivateGeneration"
            f" {applied.installed_pack_id} {applied.generation})"
        )
    return "\n".join(lines)
