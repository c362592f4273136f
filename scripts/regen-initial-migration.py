"""Regenerate migrations/versions/0001_initial_schema.py from schema.py (pre-release only).

Until the first release, the initial revision is regenerated whenever schema.py changes, so there is
one migration to review. After a release, add a new revision instead. Needs a server to autogenerate
against (the test server rules of connector.common.core.testdb).

Usage: .venv/bin/python scripts/regen-initial-migration.py
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import psycopg
from alembic import command

from connector.common.core import testdb
from connector.common.store import migrate
from connector.common.store.schema import DDL_STATEMENTS

VERSIONS = migrate.MIGRATIONS / "versions"
TARGET = VERSIONS / "0001_initial_schema.py"


def main() -> None:
    server = testdb.server_url()
    name = f"connector_regen_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        TARGET.unlink(missing_ok=True)
        cfg = migrate.alembic_config(testdb.with_database(server, name))
        url = testdb.with_database(server, name)
        engine = migrate.engine_for(url)
        with engine.connect() as connection:
            cfg.attributes["connection"] = connection
            command.revision(cfg, message="initial schema", autogenerate=True, rev_id="0001")
        engine.dispose()
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    text = TARGET.read_text()
    text = re.sub(r"Create Date: .*\n", "", text)
    frozen = (
        "\n# Database-enforced invariants, frozen at this revision (schema.DDL_STATEMENTS).\nINVARIANTS = (\n"
        + "".join(f"    {st.strip()!r},\n" for st in DDL_STATEMENTS)
        + ")\n"
    )
    text = text.replace("\n\ndef upgrade() -> None:", frozen + "\n\ndef upgrade() -> None:", 1)
    text = text.replace(
        "    # ### end Alembic commands ###\n",
        "    # ### end Alembic commands ###\n    for statement in INVARIANTS:\n        op.execute(statement)\n",
        1,
    )
    text = text.replace(
        "def downgrade() -> None:\n",
        "def downgrade() -> None:\n"
        "    for fn in ('connector_event_facts_immutable', 'connector_receipt_immutable',\n"
        "               'connector_work_item_reconciled_final', 'connector_legacy_outcome_receipt_final'):\n"
        "        op.execute(f'DROP FUNCTION IF EXISTS {fn}() CASCADE')\n",
        1,
    )
    TARGET.write_text(text)
    print(f"wrote {Path(TARGET).relative_to(Path.cwd())}")


if __name__ == "__main__":
    main()
