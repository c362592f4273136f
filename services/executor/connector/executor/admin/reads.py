"""The admin API's reads, under the names the servicer calls them by; the statements are the
store's: dead letters and one WorkItem (``store.work_items``: ``work_item_list_dead``,
``work_item_get``), failed receipts and one receipt (``store.receipts``: ``receipt_list_failed``,
``receipt_get``), processes (``store.processes.process_list_page``). Each store function names the
index its statement reads.
"""

from __future__ import annotations

from connector.common.store.processes import process_list_page as process_list
from connector.common.store.receipts import receipt_get
from connector.common.store.receipts import receipt_list_failed as receipt_failure_list
from connector.common.store.work_items.admin import DeadLetterFilter, work_item_get
from connector.common.store.work_items.admin import work_item_list_dead as dead_letter_list

__all__ = [
    "DeadLetterFilter",
    "dead_letter_list",
    "process_list",
    "receipt_failure_list",
    "receipt_get",
    "work_item_get",
]
