"""The receipt batch statement's plan does not grow with the table: the duplicate lookup is an index
scan of the unique (namespace, idempotency_key) index, for custom and generic plans alike."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from connector.common.store.receipts.insert import RECEIPT_GET_BY_KEYS, RECEIPT_INSERT_BATCH

UNIQUE = "uq_connector_ingress_receipt_namespace_idempotency_key"


def _prepared(sql: str, names: list[str]) -> str:
    for i, name in enumerate(names, 1):
        sql = sql.replace(f"%({name})s", f"${i}").replace(f"%({name})b", f"${i}")
    assert "%(" not in sql
    return sql


@pytest.fixture
def big_table(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield _filled(conn)


def _filled(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute(
        """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method, received_at,
             payload_sha256, body, verification)
           SELECT 'ns', 'r', 'r:id:' || g, 'POST', now(), '\\x00', '\\x7b7d', 'none'
           FROM generate_series(1, 50000) g"""
    )
    conn.execute("ANALYZE connector_ingress_receipt")
    return conn


@pytest.mark.parametrize("mode", ["force_custom_plan", "force_generic_plan"])
def test_receipt_insert_batch_plan(big_table: psycopg.Connection, mode: str) -> None:
    conn = big_table
    sql = _prepared(RECEIPT_INSERT_BATCH, ["envelope", "payload_sha256", "body"])
    conn.execute(f"PREPARE receipt_insert_batch(jsonb, bytea[], bytea[]) AS {sql}")
    conn.execute(f"SET plan_cache_mode = {mode}")
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            """EXPLAIN EXECUTE receipt_insert_batch(
                 '[["ns","r",1,1,null,"r:id:7","POST",null,null,1000000,"{}","none"]]',
                 ARRAY['\\x00'::bytea], ARRAY['\\x7b7d'::bytea])"""
        )
    )
    assert f"Conflict Arbiter Indexes: {UNIQUE}" in plan
    assert f"Index Scan using {UNIQUE} on connector_ingress_receipt r" in plan
    assert "Seq Scan on connector_ingress_receipt" not in plan, plan


def test_receipt_get_by_keys_plan(big_table: psycopg.Connection) -> None:
    sql = _prepared(RECEIPT_GET_BY_KEYS, ["namespace", "idempotency_key"])
    conn = big_table
    conn.execute(f"PREPARE receipt_get_by_keys(text[], text[]) AS {sql}")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    plan = "\n".join(
        r[0] for r in conn.execute("EXPLAIN EXECUTE receipt_get_by_keys(ARRAY['ns'], ARRAY['r:id:7'])")
    )
    assert UNIQUE in plan and "Seq Scan on connector_ingress_receipt" not in plan, plan
