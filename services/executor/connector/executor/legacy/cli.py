"""``connector executor --claim-path event --pack NAME [--generation N]``: run the legacy Event path
for one pack generation (docs/cutover.md)."""

from __future__ import annotations

import argparse
import sys

from connector.common.core import runtime
from connector.common.core.settings import DatabaseSettings, ExecutorSettings
from connector.executor.legacy.executor import LegacyNotAdmitted
from connector.executor.legacy.service import LegacyService


def cli(args: argparse.Namespace, db: DatabaseSettings, cfg: ExecutorSettings) -> int:
    """Run the legacy Event path for one pack generation until SIGTERM/SIGINT or until the
    generation stops admitting it (drained). Exit 2 when it is not admitted (fail closed)."""
    pack = getattr(args, "pack", None)
    if not pack:
        print("connector executor: --claim-path event needs --pack NAME_OR_ID", file=sys.stderr)
        return 2
    db.url()
    # Heartbeat well inside the lease, so "a live legacy process" is visible to the cutover gate.
    heartbeat_s = max(0.5, min(5.0, cfg.lease_s / 3.0))
    service = LegacyService(
        db, cfg, pack=str(pack), generation=getattr(args, "generation", None), heartbeat_s=heartbeat_s
    )
    refused: list[str] = []

    async def main() -> None:
        try:
            await runtime.run_until_signal([service], stop=service.exited)
        except LegacyNotAdmitted as exc:
            refused.append(str(exc))

    runtime.run(main)
    if refused:
        print(f"connector executor: refusing to start the legacy Event path: {refused[0]}", file=sys.stderr)
        return 2
    return 0
