"""Every statement on ``connector_process``: the registry of running service processes.

A row says what a process may claim (``claim_capability``), which version (and source revision) it
runs and when it last
proved it is alive (``heartbeat_at``, always the *database* clock). Liveness is judged by heartbeat
age; rows silent for longer than the prune age are deleted by any registered process. The cutover
gates read it as the source of "zero claim-capable old processes" (docs/cutover.md). The actor that
registers and heartbeats is ``connector.common.core.process_registry.ProcessRegistration``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.rows import fetch_dicts

Conn = AsyncConnection[Any]

PROCESS_REGISTER = """
INSERT INTO connector_process (process_id, service, hostname, pid, version, revision, claim_capability,
  started_at, heartbeat_at)
VALUES (%(process_id)s, %(service)s, %(hostname)s, %(pid)s, %(version)s, %(revision)s, %(capability)s, now(),
  now())
ON CONFLICT (process_id) DO UPDATE SET heartbeat_at = now()
"""

PROCESS_HEARTBEAT = "UPDATE connector_process SET heartbeat_at = now() WHERE process_id = %(process_id)s"

PROCESS_DEREGISTER = "DELETE FROM connector_process WHERE process_id = %(process_id)s"

PROCESS_PRUNE_STALE = """
DELETE FROM connector_process
WHERE heartbeat_at < now() - make_interval(secs => %(older_than_s)s) AND process_id <> %(process_id)s
"""

PROCESS_LIST = """
SELECT process_id, service, hostname, pid, version, claim_capability, started_at, heartbeat_at,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s
FROM connector_process
WHERE (%(capability)s::text IS NULL OR claim_capability = %(capability)s::text)
  AND (%(fresh_within_s)s::float8 IS NULL
       OR heartbeat_at >= now() - make_interval(secs => %(fresh_within_s)s::float8))
ORDER BY started_at, process_id
"""

# The admin API's page (keyset on the primary key), built from these fragments for the filters
# present: heartbeat age and staleness come from the database clock.
PROCESS_LIST_PAGE_COLUMNS = """
  p.process_id, p.service, p.hostname, p.pid, p.version, p.revision, p.claim_capability, p.started_at,
  p.heartbeat_at, now() - p.heartbeat_at AS heartbeat_age,
  p.heartbeat_at < now() - make_interval(secs => %(stale_after_s)s::float8) AS stale"""
PROCESS_LIST_PAGE = "SELECT {columns} FROM connector_process p{where} ORDER BY p.process_id LIMIT %(limit)s"

# Legacy-capable processes that could claim a generation: scoped to it, or of unknown scope.
PROCESS_LIST_LEGACY_FRESH = """
SELECT process_id, service, hostname, pid, version,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_s
FROM connector_process
WHERE claim_capability = 'legacy_event'
  AND heartbeat_at >= now() - make_interval(secs => %(stale_s)s::float8)
  AND (service = %(scope)s OR service NOT LIKE 'executor-legacy:%%')
ORDER BY process_id
"""

PROCESS_COUNT_WORK_ITEM_FRESH = """
SELECT count(*)::bigint FROM connector_process
WHERE claim_capability = 'work_item' AND heartbeat_at >= now() - make_interval(secs => %(stale_s)s::float8)
"""

# The admission round of a WorkItem executor (docs/cutover.md, gate 3 and 4): the process's row names
# the admitting receipt of every generation whose authority is ``work_item/work_item_active`` now,
# read FOR SHARE so that a transition waits for the round and every round after it sees the new phase.
# The claim statements admit a generation for the process only while its row names that receipt
# (``work_items.claim.AUTHORITY_ROWS``); a generation in any other phase is dropped here. The row is
# written only when the set changed (a round is cheap enough to run every second).
PROCESS_ADMIT = """
WITH wanted AS (SELECT ARRAY(
  SELECT a.cutover_receipt_id FROM connector_claim_authority a
  WHERE a.claim_path = 'work_item' AND a.phase = 'work_item_active' AND a.cutover_receipt_id IS NOT NULL
  ORDER BY a.installed_pack_id, a.generation
  FOR SHARE) AS ids)
UPDATE connector_process p SET admitted_receipt_ids = wanted.ids FROM wanted
WHERE p.process_id = %(process_id)s AND p.claim_capability = 'work_item'
  AND p.admitted_receipt_ids IS DISTINCT FROM wanted.ids
RETURNING p.admitted_receipt_ids
"""

# Gate 4's measure: WorkItem executors whose row names a receipt of the generation (they can claim it
# while its authority admits that receipt), or that declare no admission at all (``undeclared``: an
# older build claims every admitted generation), live or not (``live``: heartbeat within ``stale_s``).
PROCESS_LIST_ADMITTING = """
SELECT p.process_id, p.service, p.hostname, p.pid, p.version, p.revision,
       extract(epoch FROM now() - p.heartbeat_at)::float8 AS heartbeat_age_s,
       p.heartbeat_at >= now() - make_interval(secs => %(stale_s)s::float8) AS live,
       p.admitted_receipt_ids IS NULL AS undeclared
FROM connector_process p
WHERE p.claim_capability = 'work_item'
  AND (p.admitted_receipt_ids IS NULL OR EXISTS (SELECT 1 FROM connector_cutover_receipt r
              WHERE r.cutover_receipt_id = ANY (p.admitted_receipt_ids)
                AND r.installed_pack_id = %(pack)s AND r.generation = %(generation)s))
ORDER BY p.process_id
"""


@dataclass(frozen=True, slots=True)
class ProcessRow:
    process_id: str
    service: str
    hostname: str
    pid: int
    version: str
    claim_capability: str
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float


async def process_register(conn: Conn, row: dict[str, Any]) -> None:
    await conn.execute(PROCESS_REGISTER, row)


async def process_heartbeat(conn: Conn, process_id: str) -> bool:
    """True when the row was still there (False: it was pruned; the caller re-registers)."""
    cur = await conn.execute(PROCESS_HEARTBEAT, {"process_id": process_id})
    return cur.rowcount == 1


async def process_deregister(conn: Conn, process_id: str) -> None:
    await conn.execute(PROCESS_DEREGISTER, {"process_id": process_id})


async def process_prune_stale(conn: Conn, older_than_s: float, keep: str = "") -> int:
    cur = await conn.execute(PROCESS_PRUNE_STALE, {"older_than_s": older_than_s, "process_id": keep})
    return cur.rowcount


async def process_list(
    conn: Conn, *, capability: str | None = None, fresh_within_s: float | None = None
) -> list[ProcessRow]:
    cur = await conn.execute(PROCESS_LIST, {"capability": capability, "fresh_within_s": fresh_within_s})
    return [ProcessRow(*row) for row in await cur.fetchall()]


async def process_list_page(
    conn: Conn,
    service: str | None,
    *,
    stale_after_s: float,
    after: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Registered processes by process id (keyset on the primary key), optionally of one service."""
    clauses: list[str] = []
    params: dict[str, Any] = {"stale_after_s": stale_after_s, "limit": limit}
    if service is not None:
        clauses.append("p.service = %(service)s")
        params["service"] = service
    if after is not None:
        clauses.append("p.process_id > %(after)s")
        params["after"] = after
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    query = PROCESS_LIST_PAGE.format(columns=PROCESS_LIST_PAGE_COLUMNS, where=where)
    return await fetch_dicts(conn, query, params)


async def process_list_legacy_fresh(conn: Conn, *, stale_s: float, scope: str) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, PROCESS_LIST_LEGACY_FRESH, {"stale_s": stale_s, "scope": scope})


async def process_count_work_item_fresh(conn: Conn, *, stale_s: float) -> int:
    cur = await conn.execute(PROCESS_COUNT_WORK_ITEM_FRESH, {"stale_s": stale_s})
    row = await cur.fetchone()
    return int(row[0]) if row is not None else 0


async def process_admit(conn: Conn, process_id: str) -> list[int] | None:
    """One admission round (``PROCESS_ADMIT``): the receipt ids now admitted when they changed, None
    when they did not (or the process has no row: it re-registers at its next heartbeat)."""
    cur = await conn.execute(PROCESS_ADMIT, {"process_id": process_id})
    row = await cur.fetchone()
    return None if row is None else [int(x) for x in row[0]]


async def process_list_admitting(
    conn: Conn, *, installed_pack_id: int, generation: int, stale_s: float
) -> list[dict[str, Any]]:
    return await fetch_dicts(
        conn,
        PROCESS_LIST_ADMITTING,
        {"pack": installed_pack_id, "generation": generation, "stale_s": stale_s},
    )
