"""Test build of the executor for tests/test_sql_budget.py's control: ``connector executor`` with the
old per-item claim guard injected — after every claim batch, one claim-authority lookup per claimed
item (``authority.claim_authority_get``), the amplification the SQL budget must catch.

    python -m tests.sqlbudget_amplified_executor executor --no-admin
"""

from __future__ import annotations

import sys
from typing import Any

from connector.common.store import authority, work_items

_claim = work_items.claim.work_item_claim_plain_batch  # what an unlimited pack's batches go through
_PACK = work_items.claim.CLAIM_COLUMNS.index("installed_pack_id")
_GENERATION = work_items.claim.CLAIM_COLUMNS.index("generation")


async def _claim_with_per_item_guard(conn: Any, *args: Any, **kwargs: Any) -> Any:
    rows = await _claim(conn, *args, **kwargs)
    for row in rows:  # the amplification: one round trip per claimed item
        await authority.claim_authority_get(conn, row[_PACK], row[_GENERATION])
    return rows


def main() -> int:
    work_items.claim.work_item_claim_plain_batch = _claim_with_per_item_guard  # type: ignore[assignment]
    from connector.cli.main import main as connector_main

    return connector_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
