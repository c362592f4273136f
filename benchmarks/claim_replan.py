"""A claim plan made again while the statistics are stale (NOTES.md, session 10 finding):

    .venv/bin/python -m benchmarks.claim_replan [--idle 2000] [--backlog 30000]

The premise of ``tests/executor/test_explain.py::test_claim_plan_stays_by_id_when_the_backlog_grows``:
statistics taken at an idle moment (every item finished, no ready row), then a backlog builds up
before autovacuum re-analyzes. The test checks the generic plan made *at* the idle moment and kept.
This probe also makes the plan again afterwards (``DEALLOCATE`` + ``PREPARE``: what a new
connection, a restarted executor or a cache reset after a shared-invalidation overflow does) and
prints, for each claim statement, the index the candidate read walks, the rows it reads and the
buffers it touches, for the kept plan and the re-made one.

Found (main d3c2994, PostgreSQL 15): the kept plan reads 64 rows of ``ix_connector_work_item_ready``
(6 buffers); the re-made one walks ``ix_connector_work_item_installed_pack_id_generation_state``
over the whole backlog (30,000 rows, ~814 buffers per claim) and sorts it, for every claim
statement. The test failed so under load (a re-plan mid-test); the re-made plan is the product
risk. Runs on a scratch database; prints only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


from connector.common.store import work_items  # noqa: E402
from tests.plans import claim_plans_on_idle_statistics  # noqa: E402

STATEMENTS = {
    "plain": "WORK_ITEM_CLAIM_PLAIN_BATCH",
    "circuit": "WORK_ITEM_CLAIM_CIRCUIT_BATCH",
    "rate": "WORK_ITEM_CLAIM_RATE_BATCH",
    "flow": "WORK_ITEM_CLAIM_BATCH",
}


def _buffers(node: dict[str, int]) -> int:
    return node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)


def probe(name: str, statement: str, idle: int, backlog: int) -> None:
    kept, remade = claim_plans_on_idle_statistics(statement, idle=idle, backlog=backlog)
    plans = {"kept": kept, "re-made": remade}
    for label, plan in plans.items():
        reads = [
            f"{n['Index Name']} rows={n.get('Actual Rows')} buffers={_buffers(n)}"
            for n in plan
            if n.get("Relation Name") == "connector_work_item"
            and n.get("Index Name")
            and n["Index Name"] != "pk_connector_work_item"
            and n.get("Actual Rows")
        ]
        print(f"{name:8} {label:8} {'; '.join(reads) or '-'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=int, default=2_000)
    ap.add_argument("--backlog", type=int, default=30_000)
    args = ap.parse_args()
    for name, const in STATEMENTS.items():
        probe(name, getattr(work_items.claim, const), args.idle, args.backlog)


if __name__ == "__main__":
    main()
