"""The commit horizon needs to see other roles' transactions: the service says when it cannot."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from connector.common.core import settings, testdb
from connector.materializer import metrics
from connector.materializer.service import MaterializerService


async def _visible_after_start(url: str) -> float:
    cfg = settings.MaterializerSettings(grpc_port=0, metrics_port=0, pool_min_size=1, pool_max_size=2)
    svc = MaterializerService(settings.DatabaseSettings(), cfg, url=url)
    metrics.HORIZON_VISIBLE.set(-1)
    await svc.start()
    try:
        return metrics.HORIZON_VISIBLE._value.get()
    finally:
        await svc.stop()


@pytest.mark.parametrize("privileged", [True, False])
async def test_horizon_visibility_is_reported(db_url: str, privileged: bool, caplog) -> None:
    if privileged:
        assert await _visible_after_start(db_url) == 1
        return
    role = f"connector_t_role_{uuid.uuid4().hex[:8]}"
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT ALL ON ALL TABLES IN SCHEMA public TO {}").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}").format(sql.Identifier(role))
        )
    try:
        limited = psycopg.conninfo.make_conninfo(db_url, user=role)
        assert await _visible_after_start(limited) == 0
        assert any("commit horizon sees only this role" in r.getMessage() for r in caplog.records)
    finally:
        with psycopg.connect(testdb.server_url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(dbname)))
            )
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
