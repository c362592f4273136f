"""The active routes of every pack, as the materializer routes with them: each pack's active
generation with its claim authority (re-checked under a share lock by every batch) and its routes'
specs (docs/packs.md, "Generations, activation, versions"). The statement is store/packs.py's."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection
from pydantic import ValidationError

from connector.common.packs.manifest import (
    RouteSpec,
    WorkTypeSpec,
    priority_heads,
)
from connector.common.store import packs as store_packs

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ActiveRoute:
    route_id: int
    route_version: int
    route_key: str
    spec: RouteSpec
    #: The work types of the route's fan-out, from the generation's manifest.
    work_types: Mapping[str, WorkTypeSpec]
    #: Work type → ``priority_head_s`` of its items (``packs.priority_heads`` of the manifest;
    #: missing: 0, due order).
    priority_heads: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ActivePack:
    """A pack's active generation as the materializer routes against it."""

    installed_pack_id: int
    name: str
    namespace: str
    incarnation: int
    generation: int
    #: Claim authority of the generation (``None``: no authority row — nothing may be materialized).
    claim_path: str | None
    phase: str | None
    routes: Mapping[str, ActiveRoute] = field(default_factory=dict)
    #: Why the generation cannot be routed against (``None`` when it can): a metric label.
    problem: str | None = None

    @property
    def snapshot(self) -> tuple[int, int, int, str | None, str | None]:
        """What a batch transaction re-checks under a share lock on the pack and authority rows."""
        return (self.installed_pack_id, self.incarnation, self.generation, self.claim_path, self.phase)


class RouteCache:
    """Active packs by namespace, reloaded on ``connector_packs`` notifications (by the owner of the
    listening connection) and periodically. Lookups are dict reads; ``refresh`` swaps atomically."""

    def __init__(self) -> None:
        self._packs: dict[str, ActivePack] = {}
        #: Incremented by every successful refresh.
        self.version = 0

    def pack(self, namespace: str) -> ActivePack | None:
        return self._packs.get(namespace)

    def route(self, namespace: str, route_key: str) -> ActiveRoute | None:
        pack = self._packs.get(namespace)
        return None if pack is None else pack.routes.get(route_key)

    @property
    def packs(self) -> Sequence[ActivePack]:
        return list(self._packs.values())

    async def refresh(self, conn: AsyncConnection[Any]) -> None:
        packs: dict[str, ActivePack] = {}
        for row in await store_packs.pack_list_active(conn):
            packs[str(row["namespace"])] = _active_pack(row)
        self._packs = packs
        self.version += 1


def _active_pack(row: Mapping[str, Any]) -> ActivePack:
    base: dict[str, Any] = {
        "installed_pack_id": int(row["installed_pack_id"]),
        "name": str(row["name"]),
        "namespace": str(row["namespace"]),
        "incarnation": int(row["incarnation"]),
        "generation": int(row["generation"]),
        "claim_path": row["claim_path"],
        "phase": row["phase"],
    }
    try:
        raw_types = row["manifest"].get("work_types", {}) if isinstance(row["manifest"], dict) else {}
        work_types = {name: WorkTypeSpec.model_validate(spec) for name, spec in raw_types.items()}
        heads = priority_heads(row["manifest"])
        routes: dict[str, ActiveRoute] = {}
        for r in row["routes"]:
            spec = RouteSpec.model_validate(r["config"])
            routes[spec.key] = ActiveRoute(
                route_id=int(r["route_id"]),
                route_version=int(r["route_version"]),
                route_key=spec.key,
                spec=spec,
                work_types={f.work_type: work_types[f.work_type] for f in spec.fan_out},
                priority_heads={f.work_type: heads.get(f.work_type, 0.0) for f in spec.fan_out},
            )
    except (ValidationError, KeyError, TypeError, AttributeError) as exc:
        log.error(
            "active pack generation cannot be read",
            extra={"installed_pack_id": base["installed_pack_id"], "error_class": type(exc).__name__},
        )
        return ActivePack(**base, problem="config_invalid")
    return ActivePack(**base, routes=routes)
