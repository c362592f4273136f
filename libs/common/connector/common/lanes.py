"""Moved to ``connector.common.store.lanes`` (the store layer, ADR 003).

Kept only for importers that have not switched yet (the materializer's routing, router and
backfill); delete once none imports it. No statement lives here.
"""

from connector.common.schema import LANE_HOLDING_PREDICATE
from connector.common.store.lanes import (
    LANE_LOCK_BATCH,
    LANE_SETTLE_BATCH,
    Lane,
    LaneKind,
    SettleResult,
    lane_holding,
    lane_lock_batch,
    lane_repair,
    lane_settle_batch,
    lanes_change,
    lanes_of,
)

__all__ = [
    "LANE_HOLDING_PREDICATE",
    "LANE_LOCK_BATCH",
    "LANE_SETTLE_BATCH",
    "Lane",
    "LaneKind",
    "SettleResult",
    "lane_holding",
    "lane_lock_batch",
    "lane_repair",
    "lane_settle_batch",
    "lanes_change",
    "lanes_of",
]
