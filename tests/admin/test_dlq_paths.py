"""ListDeadLetters reads one failure path per generation (issue #28 item 4): dead WorkItems of
WorkItem-owned generations and the latest failed / unknown legacy outcome of legacy-owned ones,
merged newest first and paged across both without loss or repeat; and EXPLAIN of both reads on a
realistic table (the dead list through ``ix_connector_work_item_dead`` or the (pack, generation,
state) index, the legacy read through ``ix_connector_legacy_outcome_receipt_failed``, no sequential
scan of a big table; control: the legacy read without its partial index scans the table). Control
of the paging: ``test_control_a_legacy_keyset_off_by_one_repeats_rows``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from connector.common.core import testdb
from connector.common.store import legacy as legacy_store
from connector.common.store import work_items
from connector.v1 import admin_service_pb2 as pb

from .conftest import VIEW, Admin, Seed

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


async def _legacy_failure(
    seed: Seed, pack: int, at: datetime, outcomes: tuple[str, ...] = ("failed",), work_type: str = "sync"
) -> int:
    """A legacy-owned event with its outcome receipts (versions 1..n); the event id."""
    work_id = await seed.item(pack, state="awaiting_legacy_outcome", execution_owner="legacy_event")
    event_id = int(await seed.one("SELECT event_id FROM connector_work_item WHERE work_id = %s", (work_id,)))
    for version, outcome in enumerate(outcomes, 1):
        await seed.conn.execute(
            "INSERT INTO connector_legacy_outcome_receipt (event_id, installed_pack_id, generation,"
            " work_type, version, outcome, failure_class, failure_summary, actor, digest, created_at)"
            " VALUES (%s, %s, 1, %s, %s, %s, %s, 'it failed', 'legacy:p', %s, %s)",
            (event_id, pack, work_type, version, outcome,
             None if outcome == "succeeded" else f"lf-{outcome}", f"d{event_id}-{version}",
             at + timedelta(milliseconds=version)),
        )  # fmt: skip
    return event_id


async def _all_pages(admin: Admin, size: int, bound: int = 100) -> list[tuple[str, int]]:
    """Every page at ``size``; at most ``bound`` rows (a pager that repeats a row may never end)."""
    seen: list[tuple[str, int]] = []
    token = ""
    while len(seen) <= bound:
        r = await admin.stub.ListDeadLetters(
            pb.ListDeadLettersRequest(page_size=size, page_token=token), metadata=Admin.md(VIEW)
        )
        assert len(r.dead_letters) <= size
        for d in r.dead_letters:
            seen.append((d.claim_path, d.event.event_id))
            if d.claim_path == "work_item":
                assert d.work_item.work_id and not d.HasField("legacy_failure")
            else:
                assert d.legacy_failure.work_type == "sync" and not d.HasField("work_item")
        token = r.next_page_token
        if not token:
            return seen
    return seen  # the caller's comparison reports the repeats


async def test_both_paths_merged_newest_first_and_paged_once(admin: Admin, seed: Seed) -> None:
    await merged_and_paged_once(admin, seed)


async def test_control_a_legacy_keyset_off_by_one_repeats_rows(
    admin: Admin, seed: Seed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the legacy read's keyset moved past the page token's row (``(time + 1 µs, id)``, an
    off-by-one): the legacy row a page ended on comes again on the next, and the paging check fails."""
    real = legacy_store.legacy_failure_dead_letters

    async def off_by_one(conn: Any, clauses: Any, params: Any, *, after: Any, limit: int) -> Any:
        if after is not None:
            after = (after[0] + timedelta(microseconds=1), after[1])
        return await real(conn, clauses, params, after=after, limit=limit)

    monkeypatch.setattr(legacy_store, "legacy_failure_dead_letters", off_by_one)
    with pytest.raises(AssertionError, match="page size 1"):
        await merged_and_paged_once(admin, seed)


async def merged_and_paged_once(admin: Admin, seed: Seed) -> None:
    shop = await seed.pack("shop")  # WorkItem-owned
    crm = await seed.pack("crm", claim_path="legacy_event")  # legacy-owned (rollback receipt)
    expected: list[tuple[datetime, int, str, int]] = []
    for i, ago in enumerate((10, 30, 50, 40)):  # 40: the same instant as a legacy failure below
        work_id = await seed.item(shop)
        at = T0 - timedelta(seconds=ago)
        await seed.conn.execute(
            "UPDATE connector_work_item SET finished_at = %s WHERE work_id = %s", (at, work_id)
        )
        event_id = int(
            await seed.one("SELECT event_id FROM connector_work_item WHERE work_id = %s", (work_id,))
        )
        expected.append((at, 1, "work_item", event_id))
        del i
    # A dead WorkItem of the legacy-owned pack (its WorkItem period): not a dead letter now.
    await seed.item(crm)
    for ago in (20, 40, 60):
        at = T0 - timedelta(seconds=ago) - timedelta(milliseconds=1)  # version 1 at exactly T0 - ago
        expected.append(
            (at + timedelta(milliseconds=1), 0, "legacy_event", await _legacy_failure(seed, crm, at))
        )
    # Only the latest version counts: unknown then failed is listed once; failed then succeeded not.
    at = T0 - timedelta(seconds=70)
    twice = await _legacy_failure(seed, crm, at, ("unknown", "failed"))
    expected.append((at + timedelta(milliseconds=2), 0, "legacy_event", twice))
    await _legacy_failure(seed, crm, T0 - timedelta(seconds=5), ("failed", "succeeded"))

    order = [(path, e) for _, _, path, e in sorted(expected, key=lambda x: (x[0], x[1], x[3]), reverse=True)]
    assert order[3:5] == [("work_item", order[3][1]), ("legacy_event", order[4][1])], "tie: WorkItem first"
    for size in (1, 2, 3, 100):
        assert await _all_pages(admin, size) == order, f"page size {size}"

    # Filters apply to both paths.
    r = await admin.stub.ListDeadLetters(
        pb.ListDeadLettersRequest(installed_pack_id=crm, failure_class="lf-failed"), metadata=Admin.md(VIEW)
    )
    assert {d.event.event_id for d in r.dead_letters} == {e for _, _, p, e in expected if p == "legacy_event"}


# --------------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------------

N = 200_000
BIG = (
    "connector_ingress_receipt",
    "connector_event",
    "connector_work_item",
    "connector_legacy_outcome_receipt",
)


def _seed_big(db: psycopg.Connection) -> None:
    """Two packs of 100,000 deliveries: pack 1 WorkItem-owned (4 % dead), pack 2 legacy-owned with a
    legacy outcome receipt per event (2 % failed / unknown)."""
    db.execute("SET synchronous_commit = off")
    db.execute(
        "INSERT INTO connector_installed_pack (name, namespace, active_generation)"
        " VALUES ('shop', 'shop', 1), ('crm', 'crm', 1)"
    )
    db.execute(
        "WITH r AS (INSERT INTO connector_cutover_receipt (installed_pack_id, generation, kind, claim_path,"
        " proof, proof_sha256, actor) VALUES (1, 1, 'install', 'work_item', '{}', 'x', 'test')"
        " RETURNING cutover_receipt_id)"
        " INSERT INTO connector_claim_authority (installed_pack_id, generation, claim_path, phase,"
        " cutover_receipt_id) SELECT 1, 1, 'work_item', 'work_item_active', cutover_receipt_id FROM r"
        " UNION ALL SELECT 2, 1, 'legacy_event', 'legacy_active', NULL"
    )
    db.execute(
        f"""INSERT INTO connector_ingress_receipt (receipt_id, namespace, route_key, provider_delivery_id,
              idempotency_key, method, received_at, payload_sha256, body, verification, router_status)
            OVERRIDING SYSTEM VALUE
            SELECT i, 'shop', 'orders', 'd-' || i, 'orders:id:d-' || i, 'POST', now(), '\\x00', '\\x00',
                   'none', 'materialized'
            FROM generate_series(1, {N}) i"""
    )
    db.execute(
        f"""INSERT INTO connector_event (event_id, receipt_id, installed_pack_id, generation, incarnation,
              route_id, route_version, namespace, idempotency_key, delivery_seq, payload_sha256,
              parse_outcome, execution_owner, legacy_state)
            OVERRIDING SYSTEM VALUE
            SELECT i, i, 1 + i % 2, 1, 1, 1, 1, 'shop', 'orders:id:d-' || i || '#0', i, '\\x00', 'ok',
                   CASE WHEN i % 2 = 1 THEN 'legacy_event' ELSE 'work_item' END,
                   CASE WHEN i % 2 = 1 THEN 'succeeded' END
            FROM generate_series(1, {N}) i"""
    )
    db.execute(
        """INSERT INTO connector_work_item (event_id, installed_pack_id, generation, work_type, state,
             delivery_seq, run_after, finished_at, failure_class)
           SELECT event_id, installed_pack_id, 1, 'sync',
                  CASE WHEN event_id % 100 < 4 THEN 'dead' ELSE 'succeeded' END, event_id, now(),
                  now() - event_id * interval '1 second', 'x'
           FROM connector_event WHERE installed_pack_id = 1"""
    )
    db.execute(
        """INSERT INTO connector_legacy_outcome_receipt (event_id, installed_pack_id, generation, work_type,
             version, outcome, failure_class, actor, digest, created_at, projected)
           SELECT event_id, 2, 1, 'sync', 1,
                  CASE WHEN event_id % 100 = 1 THEN 'failed' WHEN event_id % 100 = 3 THEN 'unknown'
                       ELSE 'succeeded' END, 'x', 'legacy:p', 'd' || event_id,
                  now() - event_id * interval '1 second', true
           FROM connector_event WHERE installed_pack_id = 2"""
    )
    for table in (*BIG, "connector_claim_authority", "connector_installed_pack"):
        db.execute(f"VACUUM ANALYZE {table}")


@pytest.fixture(scope="module")
def big_db() -> Iterator[str]:
    with testdb.fresh_database() as url:
        with psycopg.connect(url, autocommit=True) as conn:
            _seed_big(conn)
        yield url


class _Capture:
    """Enough of a connection for the store functions: records (query, params), runs nothing."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        self.sent.append((str(query), params))
        return self

    async def fetchall(self) -> list[Any]:
        return []

    def cursor(self, *a: Any, **kw: Any) -> Any:
        return self

    @property
    def description(self) -> None:
        return None


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def _plan(db: psycopg.Connection, query: str, params: Any) -> list[dict[str, Any]]:
    with db.transaction(force_rollback=True):
        (plan,) = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params).fetchone()  # type: ignore[misc]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return list(_nodes(plan[0]["Plan"]))


async def _statements() -> list[tuple[str, str, Any]]:
    """Each read as the store builds it for ListDeadLetters: unfiltered, per pack, with a keyset."""
    flt_all = work_items.admin.DeadLetterFilter()
    flt_pack = work_items.admin.DeadLetterFilter(installed_pack_id=1)
    flt_crm = work_items.admin.DeadLetterFilter(installed_pack_id=2, generation=1)
    mid = datetime.now(UTC) - timedelta(seconds=50_000)
    out: list[tuple[str, str, Any]] = []
    for label, flt, after in (
        ("dead-all", flt_all, None),
        ("dead-pack", flt_pack, None),
        ("dead-pack-page", flt_pack, (mid, 50_000)),
        ("dead-legacy-pack", work_items.admin.DeadLetterFilter(installed_pack_id=2), None),
    ):
        cap = _Capture()
        await work_items.admin.work_item_list_dead(cap, flt, after=after, limit=101)  # type: ignore[arg-type]
        out += [(label, q, p) for q, p in cap.sent]
    for label, flt, after in (
        ("legacy-all", flt_all, None),
        ("legacy-pack", flt_crm, None),
        ("legacy-pack-page", flt_crm, (mid, 50_001)),
        ("legacy-wi-pack", flt_pack, None),
    ):
        cap = _Capture()
        clauses, params = flt.legacy_where()
        await legacy_store.legacy_failure_dead_letters(cap, clauses, params, after=after, limit=101)  # type: ignore[arg-type]
        out += [(label, q, p) for q, p in cap.sent]
    return out


@pytest.mark.slow
async def test_both_reads_use_their_partial_indexes(big_db: str) -> None:
    statements = await _statements()
    assert len(statements) == 8
    with psycopg.connect(big_db, autocommit=True) as db:
        for label, query, params in statements:
            nodes = _plan(db, query, params)
            seq = [
                n["Relation Name"]
                for n in nodes
                if n["Node Type"] == "Seq Scan" and n.get("Relation Name") in BIG
            ]
            assert seq == [], f"{label}: sequential scan of {seq}"
            indexes = {n.get("Index Name") for n in nodes}
            if label.startswith("dead"):  # the dead partial index, or (pack, generation, state)
                assert indexes & {
                    "ix_connector_work_item_dead",
                    "ix_connector_work_item_installed_pack_id_generation_state",
                }, (label, indexes)
            if label.startswith("legacy") and label != "legacy-wi-pack":
                assert "ix_connector_legacy_outcome_receipt_failed" in indexes, (label, indexes)
            read = sum(
                int(n["Actual Rows"]) * int(n.get("Actual Loops", 1))
                for n in nodes
                if n.get("Relation Name") in BIG and n["Node Type"] != "Index Only Scan"
            )
            # At most the matching dead / failed rows (4,000 dead, 2,000 failed) and their joins.
            assert read <= 25_000, (label, read)


@pytest.mark.slow
async def test_control_the_legacy_read_without_its_index_scans_the_table(big_db: str) -> None:
    statements = [s for s in await _statements() if s[0] == "legacy-all"]
    with psycopg.connect(big_db, autocommit=True) as db:
        with db.transaction(force_rollback=True):
            db.execute("DROP INDEX ix_connector_legacy_outcome_receipt_failed")
            (_, query, params) = statements[0]
            (plan,) = db.execute("EXPLAIN (FORMAT JSON) " + query, params).fetchone()  # type: ignore[misc]
            plan = plan if isinstance(plan, list) else json.loads(plan)
            nodes = list(_nodes(plan[0]["Plan"]))
    assert any(
        n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "connector_legacy_outcome_receipt"
        for n in nodes
    ), [n["Node Type"] for n in nodes]
