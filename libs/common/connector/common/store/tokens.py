"""Fencing tokens that stay unique across the database server's timelines
(docs/adr/018-identity-across-failover.md).

A claim — a WorkItem lease (``work_items.claim``), a receipt routing claim (``receipts.routing``),
a legacy Event lease (``store.legacy``) — writes its row's next token with ``token_next``: the
server's WAL timeline in the high bits, a per-row counter in the low ``TOKEN_COUNTER_BITS``::

    token = (timeline - 1) * 2**31 + (previous token's counter) + 1

The timeline is what a promotion changes: a standby promoted to primary writes on timeline ``N+1``.
After an asynchronous failover that lost the old primary's last writes, the new primary hands out
row ids again (its sequences resume from what was replicated) and its rows carry the counters that
were replicated, so a plain ``token + 1`` repeats tokens the old primary had already given out — a
late finalize from a process that claimed on the old primary then matched a *different* delivery's
row with the same id and token (issue #26). With the timeline in the token no claim made on one
timeline can equal a claim made on another; within a timeline tokens are strictly increasing per
row, as before. On timeline 1 (a server never promoted) the tokens are exactly the old ones
(1, 2, 3, …).

The timeline is read once per statement (an uncorrelated subquery: an InitPlan) by the schema's
function ``connector_server_timeline()``: the WAL file name of the current insert position starts
with it (``pg_walfile_name(pg_current_wal_lsn())``, callable by every role; it raises on a standby,
where a claim could not write anyway; a server without WAL functions — Aurora, whose storage
replicates so that a failover loses no commit — answers 1). ``pg_control_checkpoint()`` is no
substitute: its timeline changes only at the first checkpoint after a promotion. Cost: ~1.4 µs per
statement (the function's exception block), against 0.4 µs inline.

The fenced writes (renew, complete, fail, release, the routing marks) compare tokens for equality,
unchanged: a claim lost with the old primary's tail has no row with its token on the new timeline,
and a claim that was replicated is the same claim of the same row.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

#: Bits of a token that count the claims of its row on one timeline.
TOKEN_COUNTER_BITS = 31
_COUNTER_MASK = (1 << TOKEN_COUNTER_BITS) - 1

#: The server's current timeline (1 until the first promotion), as one SQL value per statement
#: (``schema.DDL_STATEMENTS``: ``connector_server_timeline()``).
TIMELINE = "(SELECT connector_server_timeline())"

#: ``(timeline - 1) << TOKEN_COUNTER_BITS``, once per statement.
_TIMELINE_BASE = f"(SELECT (connector_server_timeline() - 1) << {TOKEN_COUNTER_BITS})"


def token_next(column: str) -> str:
    """The SQL expression of the next fencing token of a row whose token column is ``column``."""
    return f"({_TIMELINE_BASE} + ({column} & {_COUNTER_MASK}) + 1)"


def token_timeline(token: int) -> int:
    """The server timeline a token was handed out on (docs, the admin CLI)."""
    return (int(token) >> TOKEN_COUNTER_BITS) + 1


TIMELINE_CURRENT = f"SELECT {TIMELINE}"


async def timeline_current(conn: AsyncConnection[Any]) -> int:
    """The timeline the connected server writes on."""
    cur = await conn.execute(TIMELINE_CURRENT)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])
