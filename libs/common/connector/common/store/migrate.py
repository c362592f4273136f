"""Apply migrations (``connector db upgrade``) and helpers shared by tests and ``connector up``."""

from __future__ import annotations

from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, pool

MIGRATIONS = Path(__file__).parent / "migrations"


def engine_for(url: str) -> Engine:
    """A short-lived SQLAlchemy engine over any libpq URL or key=value string (sockets included)."""
    return create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(url), poolclass=pool.NullPool
    )


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", "postgresql+psycopg://")
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database to ``revision`` in one transaction (Alembic takes a lock-free path:
    concurrent upgraders are serialized by an advisory lock)."""
    engine = engine_for(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7234001)")
        cfg = alembic_config(url)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    engine.dispose()


def current(url: str) -> str | None:
    engine = engine_for(url)
    try:
        with engine.connect() as conn:
            row = conn.exec_driver_sql(
                "SELECT version_num FROM alembic_version"
                " WHERE to_regclass('alembic_version') IS NOT NULL LIMIT 1"
            ).first()
            return None if row is None else str(row[0])
    except Exception:
        return None
    finally:
        engine.dispose()
