"""Every statement on ``connector_reconcile_state`` and ``connector_reconcile_run``
(docs/reconcile.md): a route's durable watermark and the checkpoint of its pass in progress, written
by the ingress' reconciler (the leader, on the connection that holds its lock); on-demand runs asked
for by the admin API and answered by that reconciler.

Rules as in every store module: one named constant per statement, noun first, one function each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection

from connector.common.store.rows import fetch_dict, fetch_dicts

Conn = AsyncConnection[Any]

#: The reconciler's leader lock: a session advisory lock ``(RECONCILE_LOCK_CLASS, 0)`` on its own
#: connection (background.session_lock_try), so one ingress process across all replicas runs passes.
RECONCILE_LOCK_CLASS = 7234104


@dataclass(frozen=True, slots=True)
class ReconcileState:
    namespace: str
    route_key: str
    #: Everything that occurred before it was listed and verified (Unix seconds; None: never).
    watermark: float | None
    #: The pass in progress (interrupted): its bounds and the next page's cursor or URL.
    pass_since: float | None
    pass_until: float | None
    pass_cursor: str | None
    last_pass_at: float | None
    last_clean_pass_at: float | None
    last_error_class: str | None
    created_at: float


_STATE_COLUMNS = """namespace, route_key, extract(epoch FROM watermark)::float8 AS watermark,
  extract(epoch FROM pass_since)::float8 AS pass_since, extract(epoch FROM pass_until)::float8 AS pass_until,
  pass_cursor, extract(epoch FROM last_pass_at)::float8 AS last_pass_at,
  extract(epoch FROM last_clean_pass_at)::float8 AS last_clean_pass_at, last_error_class,
  extract(epoch FROM created_at)::float8 AS created_at"""

RECONCILE_STATE_LIST = f"SELECT {_STATE_COLUMNS} FROM connector_reconcile_state"

# The row of a route the reconciler serves, made when it first sees it (its age counts from then:
# a route that never passes cleanly still goes stale).
RECONCILE_STATE_ENSURE = """
INSERT INTO connector_reconcile_state (namespace, route_key)
SELECT * FROM unnest(%(namespace)s::text[], %(route_key)s::text[])
ON CONFLICT (namespace, route_key) DO NOTHING
"""

# After each page of a pass: where the next page starts and the pass's running counts.
RECONCILE_STATE_CHECKPOINT = """
UPDATE connector_reconcile_state
SET pass_since = to_timestamp(%(since)s), pass_until = to_timestamp(%(until)s), pass_cursor = %(cursor)s,
    pass_listed = %(listed)s, pass_missing = %(missing)s, pass_admitted = %(admitted)s,
    updated_at = clock_timestamp()
WHERE namespace = %(namespace)s AND route_key = %(route_key)s
"""

# A clean pass: the watermark moves to its end (never back), the checkpoint goes.
RECONCILE_STATE_FINISH = """
UPDATE connector_reconcile_state
SET watermark = greatest(watermark, to_timestamp(%(until)s)), pass_since = NULL, pass_until = NULL,
    pass_cursor = NULL, pass_listed = NULL, pass_missing = NULL, pass_admitted = NULL,
    last_pass_at = clock_timestamp(), last_clean_pass_at = clock_timestamp(), last_error_class = NULL,
    last_error = NULL, last_listed = %(listed)s, last_missing = %(missing)s, last_admitted = %(admitted)s,
    updated_at = clock_timestamp()
WHERE namespace = %(namespace)s AND route_key = %(route_key)s
"""

# A failed pass: the watermark stays, the checkpoint stays (the next pass resumes there).
RECONCILE_STATE_FAIL = """
UPDATE connector_reconcile_state
SET last_pass_at = clock_timestamp(), last_error_class = %(error_class)s, last_error = %(error)s,
    updated_at = clock_timestamp()
WHERE namespace = %(namespace)s AND route_key = %(route_key)s
"""


def _state(row: dict[str, Any]) -> ReconcileState:
    return ReconcileState(**row)


async def reconcile_state_list(conn: Conn) -> list[ReconcileState]:
    return [_state(r) for r in await fetch_dicts(conn, RECONCILE_STATE_LIST, {})]


async def reconcile_state_ensure(conn: Conn, routes: Sequence[tuple[str, str]]) -> None:
    await conn.execute(
        RECONCILE_STATE_ENSURE,
        {"namespace": [r[0] for r in routes], "route_key": [r[1] for r in routes]},
    )


async def reconcile_state_checkpoint(
    conn: Conn,
    namespace: str,
    route_key: str,
    *,
    since: float,
    until: float,
    cursor: str | None,
    listed: int,
    missing: int,
    admitted: int,
) -> None:
    await conn.execute(
        RECONCILE_STATE_CHECKPOINT,
        {
            "namespace": namespace,
            "route_key": route_key,
            "since": since,
            "until": until,
            "cursor": cursor,
            "listed": listed,
            "missing": missing,
            "admitted": admitted,
        },
    )


async def reconcile_state_finish(
    conn: Conn, namespace: str, route_key: str, *, until: float, listed: int, missing: int, admitted: int
) -> None:
    await conn.execute(
        RECONCILE_STATE_FINISH,
        {
            "namespace": namespace,
            "route_key": route_key,
            "until": until,
            "listed": listed,
            "missing": missing,
            "admitted": admitted,
        },
    )


async def reconcile_state_fail(
    conn: Conn, namespace: str, route_key: str, *, error_class: str, error: str
) -> None:
    await conn.execute(
        RECONCILE_STATE_FAIL,
        {"namespace": namespace, "route_key": route_key, "error_class": error_class, "error": error[:500]},
    )


# --------------------------------------------------------------------------------------------------
# On-demand runs: the admin API asks (``reconcile_run_insert``), the reconciler leader answers
# --------------------------------------------------------------------------------------------------

#: A run nobody took within this long is not taken any more (its asker gave up long ago).
RUN_PICKUP_S = 600

RECONCILE_RUN_INSERT = """
INSERT INTO connector_reconcile_run (namespace, route_key, since, dry_run, actor)
VALUES (%(namespace)s, %(route_key)s, to_timestamp(%(since)s), %(dry_run)s, %(actor)s)
RETURNING run_id
"""

# The oldest pending runs, taken by the leader (partial index on pending runs).
RECONCILE_RUN_CLAIM = f"""
UPDATE connector_reconcile_run r SET state = 'running', started_at = clock_timestamp(),
  claim_owner = %(owner)s
WHERE r.run_id IN (
  SELECT run_id FROM connector_reconcile_run
  WHERE state = 'pending' AND requested_at > now() - make_interval(secs => {RUN_PICKUP_S})
  ORDER BY run_id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
RETURNING r.run_id, r.namespace, r.route_key, extract(epoch FROM r.since)::float8 AS since, r.dry_run
"""

RECONCILE_RUN_FINISH = """
UPDATE connector_reconcile_run SET state = %(state)s, finished_at = clock_timestamp(),
  result = %(result)s::jsonb
WHERE run_id = %(run_id)s AND state = 'running'
"""

RECONCILE_RUN_GET = """
SELECT run_id, namespace, route_key, extract(epoch FROM since)::float8 AS since, dry_run, actor, state,
  extract(epoch FROM requested_at)::float8 AS requested_at,
  extract(epoch FROM finished_at)::float8 AS finished_at, result
FROM connector_reconcile_run WHERE run_id = %(run_id)s
"""


async def reconcile_run_insert(
    conn: Conn, namespace: str, route_key: str, *, since: float | None, dry_run: bool, actor: str
) -> int:
    cur = await conn.execute(
        RECONCILE_RUN_INSERT,
        {"namespace": namespace, "route_key": route_key, "since": since, "dry_run": dry_run, "actor": actor},
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def reconcile_run_claim(conn: Conn, *, owner: str, limit: int = 4) -> list[dict[str, Any]]:
    return await fetch_dicts(conn, RECONCILE_RUN_CLAIM, {"owner": owner, "limit": limit})


async def reconcile_run_finish(conn: Conn, run_id: int, *, state: str, result: str) -> None:
    await conn.execute(RECONCILE_RUN_FINISH, {"run_id": run_id, "state": state, "result": result})


async def reconcile_run_get(conn: Conn, run_id: int) -> dict[str, Any] | None:
    return await fetch_dict(conn, RECONCILE_RUN_GET, {"run_id": run_id})


#: How long an on-demand run's row (its result, who asked) is kept after it was asked for; the leader
#: then deletes it (``reconcile_run_delete_old``), so the table stays bounded however often operators
#: ask. A run still ``running`` that long ago died with its process.
RUN_KEEP_S = 30 * 86_400

# The runs asked for more than ``keep_s`` ago, oldest first, ``limit`` per statement (a small table:
# operator requests only; the leader sends it at most once an hour).
RECONCILE_RUN_DELETE_OLD = """
DELETE FROM connector_reconcile_run WHERE run_id IN (
  SELECT run_id FROM connector_reconcile_run
  WHERE requested_at < now() - make_interval(secs => %(keep_s)s::float8)
  ORDER BY run_id LIMIT %(limit)s)
"""


async def reconcile_run_delete_old(conn: Conn, *, keep_s: float = RUN_KEEP_S, limit: int = 1000) -> int:
    """Delete up to ``limit`` runs asked for more than ``keep_s`` ago; the number deleted."""
    cur = await conn.execute(RECONCILE_RUN_DELETE_OLD, {"keep_s": keep_s, "limit": limit})
    return cur.rowcount


# --------------------------------------------------------------------------------------------------
# Admin reads
# --------------------------------------------------------------------------------------------------

# A page of route states in (namespace, route_key) order after a keyset (a small table: one row per
# reconciled route). ``{where}``: ``AND namespace = %(namespace)s`` when one namespace is asked for
# (a constant fragment, never a ``param IS NULL OR`` catch-all).
RECONCILE_STATE_LIST_PAGE = """
SELECT namespace, route_key, watermark, last_pass_at, last_clean_pass_at, last_error_class, last_error,
       last_listed, last_missing, last_admitted, pass_until, created_at
FROM connector_reconcile_state
WHERE (namespace, route_key) > (%(after_ns)s, %(after_route)s) {where}
ORDER BY namespace, route_key
LIMIT %(limit)s
"""


async def reconcile_state_list_page(
    conn: Conn, namespace: str | None, *, after: tuple[str, str] | None, limit: int
) -> list[dict[str, Any]]:
    after_ns, after_route = after or ("", "")
    where = "AND namespace = %(namespace)s" if namespace is not None else ""
    return await fetch_dicts(
        conn,
        RECONCILE_STATE_LIST_PAGE.format(where=where),
        {"namespace": namespace, "after_ns": after_ns, "after_route": after_route, "limit": limit},
    )
