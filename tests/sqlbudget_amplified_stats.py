"""Test build of the executor for tests/test_sql_budget.py's live-stats control: ``connector executor``
reading the live queue depth (``work_items.stats.work_item_queue_depth``, the stats sampler's read)
once per claim batch — the old "live queue pressure in the hot loop" amplification the seed's proof
names. One read per claim batch is not per item and stays within the executor's statements-per-delivery
budget: only the live-stats bound (per second, none per claim) reports it.

    python -m tests.sqlbudget_amplified_stats executor --no-admin
"""

from __future__ import annotations

import sys
from typing import Any

from connector.common.store import work_items

_claim = work_items.claim.work_item_claim_plain_batch  # what an unlimited pack's batches go through


async def _claim_with_live_stats(conn: Any, *args: Any, **kwargs: Any) -> Any:
    rows = await _claim(conn, *args, **kwargs)
    await work_items.stats.work_item_queue_depth(conn)  # the amplification: live stats per claim batch
    return rows


def main() -> int:
    work_items.claim.work_item_claim_plain_batch = _claim_with_live_stats  # type: ignore[assignment]
    from connector.cli.main import main as connector_main

    return connector_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
