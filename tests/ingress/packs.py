"""Test helper: install a pack manifest straight into the pack tables (active generation).

The pack store belongs to another component; ingress tests only need active routes to exist, the
way the ingress reads them (``connector_route`` joined to an active ``connector_pack_generation``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from connector.common.packs.document import parse_manifest
from connector.common.packs.manifest import sha256_hex
from connector.common.store import vocabulary


def install(
    conn: psycopg.Connection[Any], manifest: Mapping[str, Any], *, generation: int = 1
) -> dict[str, int]:
    """Install ``manifest`` as the active generation; returns route ids by route key. Notifies."""
    parsed = parse_manifest(manifest)
    with conn.transaction():
        row = conn.execute(
            "SELECT installed_pack_id FROM connector_installed_pack WHERE name = %s", (parsed.name,)
        ).fetchone()
        if row is None:
            row = conn.execute(
                """INSERT INTO connector_installed_pack (name, namespace, active_generation)
                   VALUES (%s, %s, %s) RETURNING installed_pack_id""",
                (parsed.name, parsed.namespace, generation),
            ).fetchone()
        assert row is not None
        pack_id = int(row[0])
        conn.execute(
            "UPDATE connector_pack_generation SET status = 'retired' WHERE installed_pack_id = %s",
            (pack_id,),
        )
        document = parsed.model_dump(mode="json")
        conn.execute(
            """INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest,
                 manifest_sha256, activated_at) VALUES (%s, %s, 'active', %s, %s, now())""",
            (pack_id, generation, Jsonb(document), sha256_hex(document)),
        )
        ids: dict[str, int] = {}
        for route in parsed.routes:
            config = route.model_dump(mode="json")
            rid = conn.execute(
                """INSERT INTO connector_route (installed_pack_id, generation, namespace, route_key,
                     route_version, config, config_sha256)
                   VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING route_id""",
                (
                    pack_id,
                    generation,
                    parsed.namespace,
                    route.key,
                    generation,
                    Jsonb(config),
                    sha256_hex(config),
                ),
            ).fetchone()
            assert rid is not None
            ids[route.key] = int(rid[0])
        conn.execute("SELECT pg_notify(%s, '')", (vocabulary.CHANNEL_PACKS,))
    return ids


def manifest(namespace: str, routes: list[dict[str, Any]], *, name: str | None = None) -> dict[str, Any]:
    """A minimal manifest: one no-op work type every route fans out to."""
    return {
        "name": name or f"{namespace}-pack",
        "namespace": namespace,
        "work_types": {"noop": {"handler": {"kind": "python", "target": "tests.noop:handle"}}},
        "routes": [{"fan_out": [{"work_type": "noop"}], **r} for r in routes],
    }
