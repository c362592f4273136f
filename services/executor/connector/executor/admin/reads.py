"""Read statements of the admin API: dead letters, one work item, failed receipts.

Statements are built from constant fragments for the filters present (never a ``param IS NULL OR``
catch-all, which gives generic plans that ignore the partial indexes) and paginate by keyset:

* dead letters: ``ix_connector_work_item_dead`` (installed_pack_id, finished_at, work_id) WHERE
  state = 'dead', newest finish first: ``ORDER BY finished_at DESC, work_id DESC``;
* failed receipts: ``ix_connector_ingress_receipt_failed`` (namespace, receipt_id) WHERE
  router_status = 'failed', newest first;
* processes: ``connector.common.store.processes.process_list_page`` (keyset on the primary key).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row

from connector.common.store.processes import process_list_page as process_list
from connector.executor.admin.convert import EVENT_COLUMNS, RECEIPT_COLUMNS, WORK_ITEM_COLUMNS

__all__ = [
    "DeadLetterFilter",
    "dead_letter_list",
    "process_list",
    "receipt_failure_list",
    "receipt_get",
    "work_item_get",
]


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    installed_pack_id: int | None = None
    generation: int | None = None
    work_type: str | None = None
    failure_class: str | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pack": self.installed_pack_id,
            "generation": self.generation,
            "work_type": self.work_type,
            "failure_class": self.failure_class,
            "after": self.finished_after.isoformat() if self.finished_after else None,
            "before": self.finished_before.isoformat() if self.finished_before else None,
        }

    def where(self) -> tuple[list[str], dict[str, Any]]:
        """Conditions on alias ``w`` (state = 'dead' included) and their parameters."""
        clauses = ["w.state = 'dead'"]
        params: dict[str, Any] = {}
        if self.installed_pack_id is not None:
            clauses.append("w.installed_pack_id = %(pack)s")
            params["pack"] = self.installed_pack_id
        if self.generation is not None:
            clauses.append("w.generation = %(generation)s")
            params["generation"] = self.generation
        if self.work_type is not None:
            clauses.append("w.work_type = %(work_type)s")
            params["work_type"] = self.work_type
        if self.failure_class is not None:
            clauses.append("w.failure_class = %(failure_class)s")
            params["failure_class"] = self.failure_class
        if self.finished_after is not None:
            clauses.append("w.finished_at >= %(after)s")
            params["after"] = self.finished_after
        if self.finished_before is not None:
            clauses.append("w.finished_at < %(before)s")
            params["before"] = self.finished_before
        return clauses, params


_DLQ_FROM = """
FROM connector_work_item w
JOIN connector_event e ON e.event_id = w.event_id
JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id"""


async def dead_letter_list(
    conn: AsyncConnection[Any],
    flt: DeadLetterFilter,
    *,
    after: tuple[datetime | None, int] | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Dead WorkItems with event and receipt context, newest finish first, after the keyset."""
    clauses, params = flt.where()
    if after is not None:
        finished, work_id = after
        params["k_work_id"] = work_id
        if finished is None:  # NULL finish times sort first in DESC order
            clauses.append("(w.finished_at IS NOT NULL OR w.work_id < %(k_work_id)s)")
        else:
            params["k_finished"] = finished
            clauses.append("(w.finished_at, w.work_id) < (%(k_finished)s, %(k_work_id)s)")
    params["limit"] = limit
    query = (
        f"SELECT {WORK_ITEM_COLUMNS}, {EVENT_COLUMNS}, {RECEIPT_COLUMNS} {_DLQ_FROM}"
        f" WHERE {' AND '.join(clauses)}"
        " ORDER BY w.finished_at DESC, w.work_id DESC LIMIT %(limit)s"
    )
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchall()


WORK_ITEM_GET = f"""
SELECT {WORK_ITEM_COLUMNS}, {EVENT_COLUMNS}, {RECEIPT_COLUMNS},
       CASE WHEN %(with_body)s THEN r.body END AS r_body
FROM connector_work_item w
LEFT JOIN connector_event e ON e.event_id = w.event_id
LEFT JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
WHERE w.work_id = %(work_id)s
"""


async def work_item_get(
    conn: AsyncConnection[Any], work_id: int, *, with_body: bool
) -> dict[str, Any] | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(WORK_ITEM_GET, {"work_id": work_id, "with_body": with_body})
        return await cur.fetchone()


async def receipt_failure_list(
    conn: AsyncConnection[Any], namespace: str | None, *, after: int | None, limit: int
) -> list[dict[str, Any]]:
    clauses = ["r.router_status = 'failed'"]
    params: dict[str, Any] = {"limit": limit}
    if namespace is not None:
        clauses.append("r.namespace = %(namespace)s")
        params["namespace"] = namespace
    if after is not None:
        clauses.append("r.receipt_id < %(after)s")
        params["after"] = after
    query = (
        f"SELECT {RECEIPT_COLUMNS} FROM connector_ingress_receipt r WHERE {' AND '.join(clauses)}"
        " ORDER BY r.receipt_id DESC LIMIT %(limit)s"
    )
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchall()


RECEIPT_GET = f"SELECT {RECEIPT_COLUMNS} FROM connector_ingress_receipt r WHERE r.receipt_id = %(receipt_id)s"


async def receipt_get(conn: AsyncConnection[Any], receipt_id: int) -> dict[str, Any] | None:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(RECEIPT_GET, {"receipt_id": receipt_id})
        return await cur.fetchone()
