"""The migrated database equals MetaData.create_all, and the database enforces the invariants."""

from __future__ import annotations

import psycopg
import pytest

from connector.common.core import testdb
from connector.common.store import migrate, schema

CATALOG_QUERIES = {
    "columns": """
        SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, ''),
               is_identity
        FROM information_schema.columns WHERE table_schema = 'public' AND table_name <> 'alembic_version'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = 'public' AND tablename <> 'alembic_version' ORDER BY 1, 2""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE connamespace = 'public'::regnamespace AND conrelid::regclass::text <> 'alembic_version'
        ORDER BY 1, 2""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
        WHERE NOT tgisinternal ORDER BY 1, 2""",
    "functions": """
        SELECT proname, md5(prosrc) FROM pg_proc WHERE pronamespace = 'public'::regnamespace ORDER BY 1""",
    "reloptions": """
        SELECT relname, coalesce(array_to_string(reloptions, ','), '') FROM pg_class
        WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND relname <> 'alembic_version'
        ORDER BY 1""",
}


def _catalog(url: str) -> dict[str, list[tuple]]:
    with psycopg.connect(url) as conn:
        return {k: conn.execute(q).fetchall() for k, q in CATALOG_QUERIES.items()}


def test_migrations_equal_metadata_create_all(db_url: str) -> None:
    with testdb.fresh_database("connector_ca") as created:
        engine = migrate.engine_for(created)
        with engine.begin() as conn:
            # Drop what the template's migrations made, then build from MetaData alone.
            conn.exec_driver_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
            schema.metadata.create_all(conn)
        engine.dispose()
        migrated, from_metadata = _catalog(db_url), _catalog(created)
    for key in CATALOG_QUERIES:
        assert migrated[key], f"catalog {key} is empty: the comparison would prove nothing"
        only_migrated = sorted(set(migrated[key]) - set(from_metadata[key]))
        only_metadata = sorted(set(from_metadata[key]) - set(migrated[key]))
        assert (only_migrated, only_metadata) == ([], []), f"{key} drift"


def test_partial_index_predicates_are_present(db: psycopg.Connection) -> None:
    defs = dict(db.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname='public'").fetchall())
    assert (
        "WHERE (state = ANY (ARRAY['pending'::text, 'retry'::text]))" in defs["ix_connector_work_item_ready"]
    )
    assert "WHERE" in defs["ix_connector_ingress_receipt_routable"]


def test_migration_is_at_head(db_url: str) -> None:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(migrate.alembic_config(db_url)).get_current_head()
    assert migrate.current(db_url) == head


def _insert_event(db: psycopg.Connection) -> int:
    receipt_id = db.execute(
        """INSERT INTO connector_ingress_receipt (namespace, route_key, idempotency_key, method,
             received_at, payload_sha256, body, verification)
           VALUES ('ns', 'r', 'k1', 'POST', now(), '\\x00', '\\x7b7d', 'none') RETURNING receipt_id"""
    ).fetchone()[0]
    return db.execute(
        """INSERT INTO connector_event (receipt_id, installed_pack_id, generation, incarnation, route_id,
             route_version, namespace, idempotency_key, delivery_seq, payload_sha256, parse_outcome)
           VALUES (%s, 1, 1, 1, 1, 1, 'ns', 'k1', %s, '\\x00', 'ok') RETURNING event_id""",
        (receipt_id, receipt_id),
    ).fetchone()[0]


@pytest.mark.parametrize(
    "assignment",
    [
        "source_object_id = 'other'",
        "delivery_seq = delivery_seq + 1",
        "payload_sha256 = '\\x01'",
        "generation = 2",
        "route_version = 9",
    ],
)
def test_event_fact_columns_are_immutable(db: psycopg.Connection, assignment: str) -> None:
    event_id = _insert_event(db)
    with pytest.raises(psycopg.errors.RestrictViolation):
        db.execute(f"UPDATE connector_event SET {assignment} WHERE event_id = %s", (event_id,))


def test_event_legacy_columns_stay_mutable(db: psycopg.Connection) -> None:
    event_id = _insert_event(db)
    cur = db.execute(
        "UPDATE connector_event SET legacy_state = 'pending', legacy_attempts = 1 WHERE event_id = %s",
        (event_id,),
    )
    assert cur.rowcount == 1


def test_reconciled_legacy_terminal_is_never_reopened(db: psycopg.Connection) -> None:
    event_id = _insert_event(db)
    work_id = db.execute(
        """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, state,
             delivery_seq) VALUES (%s, 1, 1, 'w', 'reconciled_legacy_terminal', 1) RETURNING work_id""",
        (event_id,),
    ).fetchone()[0]
    with pytest.raises(psycopg.errors.RestrictViolation):
        db.execute("UPDATE connector_work_item SET state = 'pending' WHERE work_id = %s", (work_id,))


def test_work_item_unique_per_event_and_work_type(db: psycopg.Connection) -> None:
    event_id = _insert_event(db)
    insert = """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type,
                  delivery_seq) VALUES (%s, 1, 1, 'w', 1) ON CONFLICT DO NOTHING"""
    assert db.execute(insert, (event_id,)).rowcount == 1
    assert db.execute(insert, (event_id,)).rowcount == 0
