"""Databases for tests and benchmarks.

Server resolution, in order: ``CONNECTOR_TEST_DATABASE_URL``; PostgreSQL on 127.0.0.1:5432 if it
answers (present on this project's machines); a testcontainers PostgreSQL when Docker answers;
otherwise an embedded PostgreSQL in ``.data/test-pg``. A template database is migrated once per
schema version (its name carries a hash of the migrations) and every test gets a fresh copy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from connector.common.store import migrate

log = logging.getLogger(__name__)

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/test"
_LOCK_KEY = 7234002


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


@lru_cache(maxsize=1)
def server_url() -> str:
    """A URL of a maintenance database on the test server (we create and drop databases there)."""
    explicit = os.environ.get("CONNECTOR_TEST_DATABASE_URL")
    if explicit:
        return explicit
    if _answers(LOCAL_URL):
        return LOCAL_URL
    try:  # pragma: no cover - only where Docker runs
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:16-alpine", driver=None)
        container.start()
        return str(container.get_connection_url())
    except Exception as exc:  # no docker engine: fall through to the embedded server
        log.debug("testcontainers PostgreSQL unavailable: %s", type(exc).__name__)
    from connector.common.core.embedded import start_embedded

    return start_embedded(Path(os.environ.get("CONNECTOR_TEST_DATA_DIR", ".data/test-pg")))


def with_database(url: str, dbname: str) -> str:
    """The same server, another database (URL form kept when given a URL)."""
    if "://" in url:
        parts = urlsplit(url)
        return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))
    return psycopg.conninfo.make_conninfo(url, dbname=dbname)


def schema_fingerprint() -> str:
    h = hashlib.sha256()
    for path in sorted(migrate.MIGRATIONS.rglob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


@lru_cache(maxsize=1)
def template_name() -> str:
    """Create (once per schema fingerprint, race-free across processes) the migrated template."""
    name = f"connector_tpl_{schema_fingerprint()}"
    admin = server_url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if not exists:
                building = f"{name}_build"
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(building))
                )
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
                migrate.upgrade(with_database(admin, building))
                conn.execute(
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(building), sql.Identifier(name)
                    )
                )
                conn.execute(sql.SQL("ALTER DATABASE {} WITH is_template true").format(sql.Identifier(name)))
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return name


def create_database(prefix: str = "connector_t") -> str:
    """A fresh migrated database; returns its URL."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    tpl = template_name()
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(tpl))
        )
    return with_database(server_url(), name)


def drop_database(url: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name))))


@contextmanager
def fresh_database(prefix: str = "connector_t") -> Iterator[str]:
    url = create_database(prefix)
    try:
        yield url
    finally:
        drop_database(url)
