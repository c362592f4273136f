"""Test build of the ingress for tests/test_sql_budget_reconcile.py's control: ``connector ingress``
whose reconciler looks up each listed delivery's receipt with its own statement (one
``receipt_keys_present`` per key instead of one per page), the amplification the budget must catch.

    python -m tests.sqlbudget_amplified_ingress ingress
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from connector.ingress.reconcile import reconciler

_lookup = reconciler.receipt_keys_present


async def _per_key(conn: Any, namespace: str, keys: Sequence[str]) -> set[str]:
    present: set[str] = set()
    for key in keys:  # the amplification: one round trip per listed delivery
        present |= await _lookup(conn, namespace, [key])
    return present


def main() -> int:
    reconciler.receipt_keys_present = _per_key  # type: ignore[assignment]
    from connector.cli.main import main as connector_main

    return connector_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
