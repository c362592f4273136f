"""Receipt reads and transitions of the admin API (sanitized by construction: the select list never
includes the body), the receipt replay, the queue statistics' receipt counts, the age of the oldest
receipt (retention's metric) and a delivery followed to its WorkItem (``connector up``)."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

from connector.common.store import vocabulary
from connector.common.store.rows import fetch_dict, fetch_dicts
from connector.common.store.tokens import token_next

Conn = AsyncConnection[Any]

# --------------------------------------------------------------------------------------------------
# Retention
# --------------------------------------------------------------------------------------------------

# The lowest receipt id is the oldest receipt left (ids follow acceptance): one primary-key probe.
RECEIPT_OLDEST_AGE = """
SELECT coalesce((SELECT extract(epoch FROM now() - accepted_at)::float8
                 FROM connector_ingress_receipt ORDER BY receipt_id LIMIT 1), 0)
"""


async def receipt_oldest_age(conn: Conn) -> float:
    """Seconds since the oldest receipt left was accepted (0: none)."""
    cur = await conn.execute(RECEIPT_OLDEST_AGE, {})
    row = await cur.fetchone()
    assert row is not None
    return float(row[0])


# --------------------------------------------------------------------------------------------------
# A delivery followed to its WorkItem (``connector up`` waits for its demo delivery with it)
# --------------------------------------------------------------------------------------------------

RECEIPT_WORK_OUTCOME = """
SELECT r.receipt_id, r.router_status, w.work_id, w.state, w.work_type
FROM connector_ingress_receipt r
LEFT JOIN connector_event e ON e.receipt_id = r.receipt_id
LEFT JOIN connector_work_item w ON w.event_id = e.event_id
WHERE r.namespace = %s AND r.provider_delivery_id = %s
ORDER BY w.work_id
"""


async def receipt_work_outcome(conn: Conn, namespace: str, delivery_id: str) -> list[tuple[Any, ...]]:
    """``(receipt_id, router_status, work_id, work item state, work type)`` per WorkItem of a provider
    delivery (empty before its receipt commits; one row with NULL work columns until it is
    materialized)."""
    cur = await conn.execute(RECEIPT_WORK_OUTCOME, (namespace, delivery_id))
    return list(await cur.fetchall())


# --------------------------------------------------------------------------------------------------
# The admin API: receipt reads (sanitized by construction: the select list never includes the
# signature, the verification secret reference or the body; the body only when asked for)
# --------------------------------------------------------------------------------------------------

# A receipt row as the admin API shows it, each column aliased ``r_<column>`` so it can share a row
# with a WorkItem's and an event's (``connector.executor.admin.convert.receipt`` reads these names).
RECEIPT_SELECT_COLUMNS = """
  r.receipt_id AS r_receipt_id, r.namespace AS r_namespace, r.route_key AS r_route_key,
  r.provider_delivery_id AS r_provider_delivery_id, r.method AS r_method,
  r.content_type AS r_content_type, r.event_kind AS r_event_kind, r.received_at AS r_received_at,
  r.accepted_at AS r_accepted_at, r.correlation_ids AS r_correlation_ids,
  r.payload_sha256 AS r_payload_sha256, r.router_status AS r_router_status, r.attempts AS r_attempts,
  r.enqueued_event_ids AS r_enqueued_event_ids, r.error_class AS r_error_class,
  r.error_summary AS r_error_summary, r.origin AS r_origin"""

# Failed receipts, newest first, keyset on the id: ``ix_connector_ingress_receipt_failed``
# (namespace, receipt_id) WHERE router_status = 'failed'. ``{where}``: the filters present (constant
# fragments, never a ``param IS NULL OR`` catch-all, whose generic plan ignores the partial index).
RECEIPT_LIST_FAILED = (
    f"SELECT {RECEIPT_SELECT_COLUMNS} FROM connector_ingress_receipt r WHERE {{where}}"
    " ORDER BY r.receipt_id DESC LIMIT %(limit)s"
)

# Failed receipts grouped into incidents (ListFailureGroups): per namespace of an installed pack the
# newest %(scan)s failed receipts (a backward range of ``ix_connector_ingress_receipt_failed``
# (namespace, receipt_id) WHERE router_status = 'failed'), grouped by route, error class and summary.
# ``{namespaces}``: every pack's namespace, or one pack's (RECEIPT_FAILED_GROUP_PACKS_*).
RECEIPT_FAILED_GROUP = """
SELECT * FROM (
    SELECT g.namespace, g.route_key, g.error_class, g.error_summary,
           count(*) FILTER (WHERE g.rn <= %(scan)s) AS n,
           min(g.accepted_at) FILTER (WHERE g.rn <= %(scan)s) AS first_at,
           max(g.accepted_at) FILTER (WHERE g.rn <= %(scan)s) AS last_at,
           max(g.receipt_id) FILTER (WHERE g.rn <= %(scan)s) AS sample_receipt_id,
           max(max(g.rn)) OVER (PARTITION BY g.namespace) > %(scan)s AS namespace_truncated
    FROM (SELECT DISTINCT p.namespace FROM connector_installed_pack p WHERE {packs}) ns
    CROSS JOIN LATERAL (
        SELECT r.namespace, r.route_key, r.error_class, r.error_summary, r.accepted_at, r.receipt_id,
               row_number() OVER (ORDER BY r.receipt_id DESC) AS rn
        FROM connector_ingress_receipt r
        WHERE r.router_status = 'failed' AND r.namespace = ns.namespace
        ORDER BY r.receipt_id DESC
        LIMIT %(scan)s + 1
    ) g
    GROUP BY g.namespace, g.route_key, g.error_class, g.error_summary
) grouped
WHERE n > 0
ORDER BY n DESC, last_at DESC, namespace, route_key
LIMIT %(limit)s
"""
RECEIPT_FAILED_GROUP_PACKS_ALL = "TRUE"
RECEIPT_FAILED_GROUP_PACKS_ONE = "p.installed_pack_id = %(pack)s"

RECEIPT_REPLAY_CHECK = """
SELECT r.receipt_id, r.router_status, r.namespace, r.route_key,
       (r.body IS NOT NULL OR r.body_ref IS NOT NULL) AS has_body,
       EXISTS (SELECT 1 FROM connector_event e WHERE e.receipt_id = r.receipt_id) AS has_events,
       p.installed_pack_id, p.active_generation,
       EXISTS (SELECT 1 FROM connector_route rt
               WHERE rt.installed_pack_id = p.installed_pack_id AND rt.generation = p.active_generation
                 AND rt.route_key = r.route_key) AS route_exists
FROM connector_ingress_receipt r
LEFT JOIN connector_installed_pack p ON p.namespace = r.namespace
WHERE r.receipt_id = %(receipt_id)s
FOR UPDATE OF r
"""

# The materializer owns routing state; a replay hands the receipt back to it as a fresh routable
# receipt. claim_token + 1 fences any stale holder of an old routing claim.
RECEIPT_REPLAY = f"""
UPDATE connector_ingress_receipt r SET
  router_status = 'pending', attempts = 0, next_attempt_at = now(),
  claim_owner = NULL, claim_token = {token_next("r.claim_token")}, lease_until = NULL, routed_at = NULL
WHERE r.receipt_id = %(receipt_id)s AND r.router_status = 'failed'
RETURNING {RECEIPT_SELECT_COLUMNS}
"""

RECEIPT_NOTIFY = f"SELECT pg_notify('{vocabulary.CHANNEL_RECEIPTS}', '')"

RECEIPT_GET = (
    f"SELECT {RECEIPT_SELECT_COLUMNS} FROM connector_ingress_receipt r WHERE r.receipt_id = %(receipt_id)s"
)


async def receipt_list_failed(
    conn: Conn, namespace: str | None, *, after: int | None, limit: int
) -> list[dict[str, Any]]:
    """Failed receipts (of ``namespace``, when given) with ids below ``after``, newest first."""
    clauses = ["r.router_status = 'failed'"]
    params: dict[str, Any] = {"limit": limit}
    if namespace is not None:
        clauses.append("r.namespace = %(namespace)s")
        params["namespace"] = namespace
    if after is not None:
        clauses.append("r.receipt_id < %(after)s")
        params["after"] = after
    return await fetch_dicts(conn, RECEIPT_LIST_FAILED.format(where=" AND ".join(clauses)), params)


async def receipt_failed_group(
    conn: Conn, installed_pack_id: int | None, *, scan: int, limit: int
) -> list[dict[str, Any]]:
    """Failed-receipt groups over the newest ``scan`` failed receipts of each pack's namespace (or
    one pack's), most frequent first; ``namespace_truncated``: older failed receipts exist."""
    packs = RECEIPT_FAILED_GROUP_PACKS_ALL if installed_pack_id is None else RECEIPT_FAILED_GROUP_PACKS_ONE
    return await fetch_dicts(
        conn,
        RECEIPT_FAILED_GROUP.format(packs=packs),
        {"scan": scan, "limit": limit, "pack": installed_pack_id},
    )


async def receipt_get(conn: Conn, receipt_id: int) -> dict[str, Any] | None:
    return await fetch_dict(conn, RECEIPT_GET, {"receipt_id": receipt_id})


async def receipt_replay_check(conn: Conn, receipt_id: int) -> dict[str, Any] | None:
    """What a receipt replay checks: the receipt (locked ``FOR UPDATE``), whether it has events, its
    namespace's active generation and whether its route is in it."""
    return await fetch_dict(conn, RECEIPT_REPLAY_CHECK, {"receipt_id": receipt_id})


async def receipt_replay(conn: Conn, receipt_id: int) -> dict[str, Any] | None:
    """A failed receipt back to ``pending`` (``None``: it is not failed)."""
    return await fetch_dict(conn, RECEIPT_REPLAY, {"receipt_id": receipt_id})


async def receipt_notify(conn: Conn) -> None:
    """Wake the materializers (``connector_receipts``)."""
    await conn.execute(RECEIPT_NOTIFY)


# Receipt counts of the admin API's queue statistics (the partial routable / routing / failed receipt
# indexes) and the WorkItem claimants heartbeating within ``stale_s``.
# ``%(pack)s`` NULL: every receipt; else the receipts of that pack's namespace (its routes).
_RECEIPT_SCOPE = """(%(pack)s::bigint IS NULL OR namespace =
     (SELECT p.namespace FROM connector_installed_pack p WHERE p.installed_pack_id = %(pack)s::bigint))"""
RECEIPT_STATS = f"""
SELECT
  (SELECT count(*) FROM connector_ingress_receipt
   WHERE router_status IN ('pending', 'retry') AND {_RECEIPT_SCOPE}) AS unrouted,
  (SELECT now() - next_attempt_at FROM connector_ingress_receipt
   WHERE router_status IN ('pending', 'retry') AND next_attempt_at <= now() AND {_RECEIPT_SCOPE}
   ORDER BY next_attempt_at LIMIT 1) AS oldest_unrouted_age,
  (SELECT count(*) FROM connector_ingress_receipt WHERE router_status = 'routing' AND {_RECEIPT_SCOPE})
    AS routing,
  (SELECT count(*) FROM connector_ingress_receipt WHERE router_status = 'failed' AND {_RECEIPT_SCOPE})
    AS failed,
  (SELECT count(*) FROM connector_process
   WHERE claim_capability = 'work_item' AND heartbeat_at >= now() - make_interval(secs => %(stale_s)s))
    AS active_claimants
"""


async def receipt_stats(conn: Conn, params: dict[str, Any]) -> dict[str, Any] | None:
    return await fetch_dict(conn, RECEIPT_STATS, params)
