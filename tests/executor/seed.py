"""Seed packs, claim authority and WorkItems straight into a database (tests and benchmarks).

The pack store (``connector.common.packs.install``) is owned elsewhere; these helpers write the few rows
the executor reads (pack, generation manifest, install cutover receipt, claim authority) and bulk
WorkItems with their receipt and event rows, so a test can build any queue shape in one statement.
Lane members are inserted ``blocked`` and then settled with ``connector.common.store.lanes`` SQL, exactly
as the materializer does.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from connector.common.core import testdb
from connector.common.packs.manifest import CircuitBreaker, Manifest, sha256_hex
from connector.common.store.circuits import CIRCUIT_DECLARE
from connector.common.store.flow import CONCURRENCY_DECLARE, RATE_LIMIT_DECLARE
from connector.common.store.lanes import LANE_LOCK_BATCH, LANE_SETTLE_BATCH

_PACK_SEQ = 0


def manifest(
    name: str, work_types: dict[str, dict[str, Any]], queue_classes: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A valid manifest with the given work types (and ``queue_classes``, when given) and one route
    fanning out to all of them."""
    doc: dict[str, Any] = {
        "name": name,
        "namespace": name,
        "work_types": work_types,
        "routes": [
            {
                "key": "r",
                "verification": {"scheme": "none"},
                "extract": {"target_lane_key": {"pointer": "/t"}},
                "fan_out": [{"work_type": wt} for wt in work_types],
            }
        ],
    }
    if queue_classes is not None:
        doc["queue_classes"] = queue_classes
    Manifest.model_validate(doc)
    return doc


def python_work_type(
    target: str,
    *,
    queue_class: str = "default",
    max_attempts: int = 10,
    backoff_base_s: float = 0.05,
    backoff_cap_s: float = 1.0,
    jitter: float = 0.0,
    timeout_s: float = 30.0,
    kind: str = "python",
) -> dict[str, Any]:
    return {
        "handler": {"kind": kind, "target": target, "timeout_s": timeout_s},
        "queue_class": queue_class,
        "retry": {
            "max_attempts": max_attempts,
            "backoff_base_s": backoff_base_s,
            "backoff_cap_s": max(backoff_cap_s, backoff_base_s),
            "jitter": jitter,
        },
    }


def seed_pack(
    conn: psycopg.Connection,
    name: str,
    work_types: dict[str, dict[str, Any]],
    *,
    generation: int = 1,
    authority: bool = True,
    queue_classes: dict[str, Any] | None = None,
) -> int:
    """Install a pack generation (active, WorkItem-owned with an install receipt when ``authority``)."""
    doc = manifest(name, work_types, queue_classes)
    row = conn.execute(
        """INSERT INTO connector_installed_pack (name, namespace, active_generation)
           VALUES (%s, %s, %s)
           ON CONFLICT (name) DO UPDATE SET active_generation = EXCLUDED.active_generation
           RETURNING installed_pack_id""",
        (name, name, generation),
    ).fetchone()
    assert row is not None
    pack_id = int(row[0])
    conn.execute(
        """INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest,
             manifest_sha256, activated_at) VALUES (%s, %s, 'active', %s, %s, now())""",
        (pack_id, generation, json.dumps(doc), sha256_hex(doc)),
    )
    if authority:
        grant_authority(conn, pack_id, generation)
    return pack_id


def grant_authority(conn: psycopg.Connection, pack_id: int, generation: int = 1) -> None:
    """The install receipt + WorkItem claim authority of a new pack generation."""
    proof = {"kind": "install", "pack": pack_id, "generation": generation}
    receipt = conn.execute(
        """INSERT INTO connector_cutover_receipt (installed_pack_id, generation, kind, claim_path, proof,
             proof_sha256, actor) VALUES (%s, %s, 'install', 'work_item', %s, %s, 'test')
           RETURNING cutover_receipt_id""",
        (pack_id, generation, json.dumps(proof), sha256_hex(proof)),
    ).fetchone()
    assert receipt is not None
    conn.execute(
        """INSERT INTO connector_claim_authority (installed_pack_id, generation, claim_path, phase,
             cutover_receipt_id) VALUES (%s, %s, 'work_item', 'work_item_active', %s)
           ON CONFLICT (installed_pack_id, generation) DO UPDATE SET claim_path = 'work_item',
             phase = 'work_item_active', cutover_receipt_id = EXCLUDED.cutover_receipt_id,
             version = connector_claim_authority.version + 1, updated_at = now()""",
        (pack_id, generation, receipt[0]),
    )


def revoke_authority(conn: psycopg.Connection, pack_id: int, generation: int = 1) -> None:
    conn.execute(
        """UPDATE connector_claim_authority SET claim_path = 'none', phase = 'quiescing',
             version = version + 1, updated_at = now()
           WHERE installed_pack_id = %s AND generation = %s""",
        (pack_id, generation),
    )


@contextlib.contextmanager
def detached_queue() -> Iterator[tuple[psycopg.Connection, int]]:
    """A fresh database with one pack ``p`` (work type ``w``, a no-op handler) whose WorkItems need no
    events: the WorkItem-to-event foreign key is dropped, so the EXPLAIN tests fill the queue with
    ``INSERT … SELECT … FROM generate_series`` at a million rows. Yields (autocommit connection, pack)."""
    with testdb.fresh_database() as url, psycopg.connect(url, autocommit=True) as db:
        pack = seed_pack(db, "p", {"w": python_work_type("tests.executor.effects:noop")})
        db.execute(
            "ALTER TABLE connector_work_item DROP CONSTRAINT fk_connector_work_item_event_id_connector_event"
        )
        yield db, pack


def seed_items(
    conn: psycopg.Connection,
    pack_id: int,
    n: int,
    *,
    work_type: str = "w",
    queue_class: str = "default",
    generation: int = 1,
    max_attempts: int = 10,
    source_lanes: Sequence[str | None] | None = None,
    target_lanes: Sequence[str | None] | None = None,
    dead_blocks_lane: bool = True,
    run_after_s: float = 0.0,
    body: bytes = b'{"n": 1}',
    labels: Sequence[str | None] | None = None,
    rate_keys: Sequence[str | None] | None = None,
    rate_limit: tuple[int, float, int] = (1, 1.0, 1),
    concurrency_keys: Sequence[str | None] | None = None,
    concurrency: int = 1,
    circuit_keys: Sequence[str | None] | None = None,
    circuit: dict[str, Any] | None = None,
    heads: Sequence[float] | None = None,
    run_afters: Sequence[float] | None = None,
) -> list[int]:
    """Insert ``n`` receipts, events and WorkItems in delivery order; returns the work ids.

    ``source_lanes`` / ``target_lanes`` give each item's lane key (None: no lane); ``labels`` are
    stored in the event's ``source_object_id`` (tests use them to check an order without lanes).
    ``rate_keys`` give each item's rate-limit key (None: unlimited); their key rows are declared with
    ``rate_limit`` = (limit, period_s, burst), as the materializer does (``flow.RATE_LIMIT_DECLARE``);
    ``concurrency_keys`` likewise, each key with at most ``concurrency`` in flight; ``circuit_keys``
    likewise, each circuit with the breaker policy ``circuit`` (``packs.CircuitBreaker`` fields).
    ``heads`` give each item's ``priority_head_s`` (claim order, docs/adr/014-priorities.md; default
    0) and ``run_afters`` each item's due time in seconds from now (default ``run_after_s``)."""
    if n == 0:
        return []
    src = list(source_lanes) if source_lanes is not None else [None] * n
    tgt = list(target_lanes) if target_lanes is not None else [None] * n
    lab = list(labels) if labels is not None else [None] * n
    rk = list(rate_keys) if rate_keys is not None else [None] * n
    ck = list(concurrency_keys) if concurrency_keys is not None else [None] * n
    cb = list(circuit_keys) if circuit_keys is not None else [None] * n
    hd = [float(h) for h in heads] if heads is not None else [0.0] * n
    ra = [float(r) for r in run_afters] if run_afters is not None else [float(run_after_s)] * n
    assert len(src) == len(tgt) == len(lab) == len(rk) == len(ck) == len(cb) == len(hd) == len(ra) == n
    circuits = sorted({k for k in cb if k is not None})
    if circuits:
        pol = CircuitBreaker.model_validate(circuit or {})
        m = len(circuits)
        conn.execute(
            CIRCUIT_DECLARE,
            {
                "packs": [pack_id] * m,
                "keys": circuits,
                "work_types": [work_type] * m,
                "cons": [pol.consecutive_failures] * m,
                "ratios": [pol.failure_ratio] * m,
                "windows": [pol.window_s] * m,
                "mins": [pol.min_outcomes] * m,
                "opens": [pol.open_s] * m,
                "probes": [pol.half_open_probes] * m,
            },
        )
    slot_keys = sorted({k for k in ck if k is not None})
    if slot_keys:
        conn.execute(
            CONCURRENCY_DECLARE,
            {
                "packs": [pack_id] * len(slot_keys),
                "keys": slot_keys,
                "work_types": [work_type] * len(slot_keys),
                "limits": [concurrency] * len(slot_keys),
            },
        )
    keys = sorted({k for k in rk if k is not None})
    if keys:
        conn.execute(
            RATE_LIMIT_DECLARE,
            {
                "packs": [pack_id] * len(keys),
                "keys": keys,
                "work_types": [work_type] * len(keys),
                "limits": [rate_limit[0]] * len(keys),
                "periods": [float(rate_limit[1])] * len(keys),
                "bursts": [rate_limit[2]] * len(keys),
            },
        )
    global _PACK_SEQ
    _PACK_SEQ += 1
    rows = conn.execute(
        """
        WITH seq AS (
          SELECT i, s, t, l, k, c, b, h, ra FROM unnest(%(src)s::text[], %(tgt)s::text[], %(lab)s::text[],
                                              %(rk)s::text[], %(ck)s::text[], %(cb)s::text[],
                                              %(hd)s::float8[], %(ra)s::float8[])
            WITH ORDINALITY AS x(s, t, l, k, c, b, h, ra, i)
        ), receipts AS (
          INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
            content_type, received_at, payload_sha256, body, verification, router_status)
          SELECT 'seed', 'r', %(tag)s || ':' || i, 'POST', 'application/json', now(),
                 '\\x00', %(body)s, 'none', 'materialized' FROM seq
          RETURNING receipt_id, idempotency_key
        ), events AS (
          INSERT INTO connector_event (receipt_id, installed_pack_id, generation, incarnation, route_id,
            route_version, namespace, source_object_kind, source_object_id, idempotency_key,
            delivery_seq, payload_sha256, parse_outcome)
          SELECT r.receipt_id, %(pack)s, %(gen)s, 1, 0, 1, 'seed', 'obj', seq.l, r.idempotency_key,
                 r.receipt_id, '\\x00', 'ok'
          FROM receipts r JOIN seq ON r.idempotency_key = %(tag)s || ':' || seq.i
          RETURNING event_id, receipt_id, idempotency_key
        )
        INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, queue_class,
          state, run_after, max_attempts, delivery_seq, source_lane_key, target_mutation_lane_key,
          dead_blocks_lane, rate_key, concurrency_key, circuit_key, priority_head_s)
        SELECT e.event_id, %(pack)s, %(gen)s, %(wt)s, %(qc)s,
               CASE WHEN seq.s IS NULL AND seq.t IS NULL THEN 'pending' ELSE 'blocked' END,
               now() + make_interval(secs => seq.ra), %(ma)s, e.receipt_id, seq.s, seq.t, %(dbl)s,
               seq.k, seq.c, seq.b, seq.h
        FROM events e JOIN seq ON e.idempotency_key = %(tag)s || ':' || seq.i
        ORDER BY seq.i
        RETURNING work_id
        """,
        {
            "src": src,
            "tgt": tgt,
            "lab": lab,
            "rk": rk,
            "ck": ck,
            "cb": cb,
            "tag": f"{pack_id}:{work_type}:{_PACK_SEQ}:{id(conn)}",
            "body": body,
            "pack": pack_id,
            "gen": generation,
            "wt": work_type,
            "qc": queue_class,
            "ra": ra,
            "hd": hd,
            "ma": max_attempts,
            "dbl": dead_blocks_lane,
        },
    ).fetchall()
    lanes = {(pack_id, "s", k) for k in src if k is not None} | {
        (pack_id, "t", k) for k in tgt if k is not None
    }
    if lanes:
        settle_lanes(conn, lanes)
    return sorted(int(r[0]) for r in rows)


def settle_lanes(conn: psycopg.Connection, lanes: set[tuple[int, str, str]]) -> None:
    ordered = sorted(lanes)
    for start in range(0, len(ordered), 500):
        chunk = ordered[start : start + 500]
        params = {
            "packs": [c[0] for c in chunk],
            "kinds": [c[1] for c in chunk],
            "keys": [c[2] for c in chunk],
        }
        with conn.transaction():
            locked = conn.execute(LANE_LOCK_BATCH, params).fetchall()
            conn.execute(
                LANE_SETTLE_BATCH,
                {
                    "packs": [r[0] for r in locked],
                    "kinds": [r[1] for r in locked],
                    "keys": [r[2] for r in locked],
                    "idle": [False] * len(locked),
                    "demote": False,
                },
            )


_EVENTS = """
WITH seq AS (
  SELECT i, l FROM unnest(%(lab)s::text[]) WITH ORDINALITY AS x(l, i)
), receipts AS (
  INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
    content_type, received_at, payload_sha256, body, verification, router_status)
  SELECT 'seed', 'r', %(tag)s || ':' || i, 'POST', 'application/json', now(),
         '\\x00', %(body)s, 'none', 'materialized' FROM seq
  RETURNING receipt_id, idempotency_key
)
INSERT INTO connector_event (receipt_id, installed_pack_id, generation, incarnation, route_id,
  route_version, namespace, source_object_kind, source_object_id, idempotency_key,
  delivery_seq, payload_sha256, parse_outcome)
SELECT r.receipt_id, %(pack)s, %(gen)s, 1, 0, 1, 'seed', 'obj', seq.l, r.idempotency_key,
       r.receipt_id, '\\x00', 'ok'
FROM receipts r JOIN seq ON r.idempotency_key = %(tag)s || ':' || seq.i
RETURNING event_id, receipt_id, source_object_id
"""


async def seed_debounced(
    adb: Any,
    pack_id: int,
    keys: Sequence[str | None],
    *,
    window_s: float,
    max_wait_s: float | None = None,
    work_type: str = "w",
    queue_class: str = "default",
    generation: int = 1,
    max_attempts: int = 10,
    labels: Sequence[str | None] | None = None,
    chunk: int = 1000,
) -> list[int]:
    """Create ``len(keys)`` receipts, events and WorkItems through the materializer's own insert
    (``materialization.materialize``: the debounce keys locked, the live items parked, ``run_after``
    from the window), ``chunk`` items per transaction as a materializer batch would; ``keys[i]`` is
    item i's debounce key (None: not debounced). Returns the work ids in order."""
    from connector.common.delivery.materialization import materialize
    from connector.common.store.debounce import DebounceKey
    from connector.common.store.work_items.insert import WorkRow

    global _PACK_SEQ
    out: list[int] = []
    lab = list(labels) if labels is not None else [None] * len(keys)
    max_wait = max_wait_s if max_wait_s is not None else 10 * window_s
    for start in range(0, len(keys), chunk):
        part = list(keys[start : start + chunk])
        _PACK_SEQ += 1
        async with adb.transaction():
            cur = await adb.execute(
                _EVENTS,
                {
                    "lab": lab[start : start + chunk],
                    "tag": f"d:{pack_id}:{work_type}:{_PACK_SEQ}:{id(adb)}",
                    "body": b'{"n": 1}',
                    "pack": pack_id,
                    "gen": generation,
                },
            )
            events = sorted((int(r[1]), int(r[0])) for r in await cur.fetchall())
            rows = [
                WorkRow(
                    event_id=ev,
                    installed_pack_id=pack_id,
                    generation=generation,
                    work_type=work_type,
                    queue_class=queue_class,
                    priority=0,
                    max_attempts=max_attempts,
                    delivery_seq=seq,
                    source_lane_key=None,
                    target_lane_key=None,
                    dead_blocks_lane=True,
                    debounce=None if k is None else DebounceKey(pack_id, work_type, k, window_s, max_wait),
                )
                for (seq, ev), k in zip(events, part, strict=True)
            ]
            await materialize(adb, (), {}, rows)
            cur = await adb.execute(
                "SELECT work_id FROM connector_work_item WHERE event_id = ANY(%s) ORDER BY work_id",
                ([ev for _, ev in events],),
            )
            out.extend(int(r[0]) for r in await cur.fetchall())
    return out
