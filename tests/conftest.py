"""Shared fixtures: a real PostgreSQL for every test (see connector.common.core.testdb for resolution)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
import pytest_asyncio

from connector.common.core import testdb


@pytest.fixture
def db_url() -> Iterator[str]:
    """A fresh, migrated database for this test."""
    with testdb.fresh_database() as url:
        yield url


@pytest.fixture
def db(db_url: str) -> Iterator[psycopg.Connection]:
    """An autocommit connection to the test's database."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        yield conn


@pytest_asyncio.fixture
async def adb(db_url: str) -> AsyncIterator[psycopg.AsyncConnection]:
    conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    try:
        yield conn
    finally:
        await conn.close()
