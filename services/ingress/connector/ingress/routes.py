"""The in-memory route table: active routes compiled once, refreshed on NOTIFY and periodically.

Routes are read from ``connector_route`` joined to the *active* pack generation
(``route_list_active``), compiled (verifier with its loaded keys, extractors, response statuses) and
swapped in atomically, keyed by ``(namespace, route_key)``. A ``connector.common.core.listener.Listener``
(its own connection, not the ingress pool) LISTENs on ``connector_packs``; every notification
triggers a refresh, and a periodic refresh is the fallback (it also re-reads file secrets, which is
how a rotated secret file takes effect).

A route whose config cannot be compiled, or whose secrets are all unreadable, stays in the table as
*unavailable*: its deliveries get the route's failure status (retryable) instead of a 404 or 401
that a provider might treat as final. The problem is logged once per refresh with the route id and
the secret *reference* name, never a value.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
from psycopg import Notify
from pydantic import ValidationError

from connector.common.core.listener import Listener, ListenerConfig
from connector.common.packs.manifest import RouteSpec
from connector.common.packs.reconcile import ReconcileSpec, effective_redelivery, reconcile_errors
from connector.common.packs.verification import SecretKey, SecretUnavailable, check_spec, load_secret, resolve
from connector.common.store import vocabulary
from connector.common.store.packs import route_list_active
from connector.ingress import metrics
from connector.ingress.envelope import Envelope
from connector.ingress.verify import HmacVerifier, NoneVerifier, Verifier

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CompiledRoute:
    route_id: int
    route_version: int
    installed_pack_id: int
    generation: int
    namespace: str
    route_key: str
    method: str
    #: ``content: json`` — the body must be valid JSON (415/400 otherwise).
    content_json: bool
    #: Whether the body must be parsed (JSON content or a pointer extraction).
    parse_body: bool
    verifier: Verifier | None
    idempotency_header: str | None
    #: Event kind, delivery id and correlation ids (``None`` when the route extracts none of them).
    envelope: Envelope | None
    success_status: int
    failure_status: int
    #: Why the route cannot take deliveries right now (``None`` when it can); a metric label.
    unavailable: str | None = None
    #: Its redelivery contract's mode (``provider_retries``, ``manual``, ``none``; docs/reconcile.md).
    redelivery: str = "none"
    #: Its reconciliation (``None``: not reconciled, or its spec cannot be used: logged).
    reconcile: ReconcileSpec | None = None
    #: The least traffic declared (``expect``): (count, window) or ``None``.
    expect: tuple[int, str] | None = None


def compile_route(row: Mapping[str, Any]) -> CompiledRoute:
    """Compile one ``connector_route`` row. Never raises: problems make the route unavailable."""
    ident = _Ident(
        route_id=int(row["route_id"]),
        route_version=int(row["route_version"]),
        installed_pack_id=int(row["installed_pack_id"]),
        generation=int(row["generation"]),
        namespace=str(row["namespace"]),
        route_key=str(row["route_key"]),
    )
    config = row["config"]
    try:
        spec = RouteSpec.model_validate(config)
    except ValidationError:
        return _unavailable(ident, config, "route_invalid")
    if check_spec(spec.verification):
        return _unavailable(ident, config, "route_invalid")
    cfg = resolve(spec.verification)
    verifier: Verifier
    unavailable: str | None = None
    if cfg.get("scheme") == "none":
        verifier = NoneVerifier()
    else:
        keys: list[SecretKey] = []
        for ref in cfg["secrets"]:
            try:
                keys.append(load_secret(ref))
            except SecretUnavailable as exc:
                log.warning(
                    "route secret unavailable", extra={"route_id": ident.route_id, "problem": str(exc)}
                )
        if keys:
            verifier = HmacVerifier(cfg, keys)
        else:
            verifier = NoneVerifier()  # never used: the route is unavailable
            unavailable = "secret_unavailable"
    envelope = Envelope(spec.extract, spec.correlation)
    reconcile = spec.reconcile
    if reconcile is not None and reconcile_errors(reconcile, config):
        log.warning("route reconcile spec unusable", extra={"route_id": ident.route_id})
        reconcile = None
    return CompiledRoute(
        *ident,
        method=spec.method,
        content_json=spec.content == "json",
        parse_body=spec.content == "json" or envelope.reads_body,
        verifier=verifier,
        idempotency_header=spec.idempotency_header,
        envelope=None if envelope.empty else envelope,
        success_status=spec.response.success_status,
        failure_status=spec.response.failure_status,
        unavailable=unavailable,
        redelivery=str(effective_redelivery(config)["mode"]),
        reconcile=reconcile,
        expect=(spec.expect.at_least, spec.expect.per) if spec.expect is not None else None,
    )


class _Ident(NamedTuple):
    route_id: int
    route_version: int
    installed_pack_id: int
    generation: int
    namespace: str
    route_key: str


def _unavailable(ident: _Ident, config: Any, reason: str) -> CompiledRoute:
    log.warning("route config cannot be compiled", extra={"route_id": ident.route_id, "problem": reason})
    cfg = config if isinstance(config, dict) else {}
    response = cfg.get("response") if isinstance(cfg.get("response"), dict) else {}
    failure = response.get("failure_status", 503) if isinstance(response, dict) else 503
    method = cfg.get("method", "POST")
    return CompiledRoute(
        *ident,
        method=method if isinstance(method, str) else "POST",
        content_json=False,
        parse_body=False,
        verifier=None,
        idempotency_header=None,
        envelope=None,
        success_status=200,
        failure_status=failure if isinstance(failure, int) and 400 <= failure <= 599 else 503,
        unavailable=reason,
        redelivery=str(effective_redelivery(cfg)["mode"]),
    )


class RouteTable:
    """Active routes by ``(namespace, route_key)``; ``get`` is a dict lookup on the hot path."""

    def __init__(self, conninfo: str, *, refresh_s: float = 30.0, reconnect_s: float = 1.0) -> None:
        self._routes: dict[tuple[str, str], CompiledRoute] = {}
        # Refresh on every notification (a burst coalesced into one), every ``refresh_s`` without
        # one, and after every reconnect; a failed refresh reconnects after ``reconnect_s``.
        self._listener = Listener(
            conninfo,
            ListenerConfig(
                channels=(vocabulary.CHANNEL_PACKS,),
                poll_interval_s=refresh_s,
                coalesce_s=0.05,
                backoff_s=reconnect_s,
                backoff_max_s=reconnect_s,
                name="ingress-route-watch",
            ),
            on_wake=self._on_wake,
            on_connect=self._on_connect,
            on_error=self._on_error,
        )
        self.loaded = False
        #: Incremented after every successful refresh (tests await ``wait_refreshed``).
        self.version = 0
        self._changed = asyncio.Condition()

    def get(self, namespace: str, route_key: str) -> CompiledRoute | None:
        return self._routes.get((namespace, route_key))

    def __len__(self) -> int:
        return len(self._routes)

    def all(self) -> list[CompiledRoute]:
        """Every active route (a snapshot of the current table)."""
        return list(self._routes.values())

    async def start(self) -> None:
        """Connect, LISTEN, load once (raises if the database does not answer), then keep watching."""
        await self._listener.start(connect_now=True)

    async def stop(self) -> None:
        await self._listener.stop()

    async def wait_refreshed(self, after: int) -> int:
        """Wait until a refresh newer than version ``after`` has completed (callers bound the wait)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.version > after)
        return self.version

    async def _on_connect(self, conn: psycopg.AsyncConnection[Any], reconnect: bool) -> None:
        await self._refresh(conn)  # first load, or notifications may have been missed while away

    async def _on_wake(self, notes: list[Notify]) -> None:
        conn = self._listener.connection
        assert conn is not None
        await self._refresh(conn)

    def _on_error(self, exc: BaseException) -> None:
        metrics.ROUTE_REFRESH.labels("error").inc()
        log.warning("route refresh failed; reconnecting", extra={"error_class": type(exc).__name__})

    async def _refresh(self, conn: psycopg.AsyncConnection[Any]) -> None:
        rows = await route_list_active(conn)
        table: dict[tuple[str, str], CompiledRoute] = {}
        for row in rows:  # ordered by generation: a later active generation wins
            route = compile_route(row)
            table[(route.namespace, route.route_key)] = route
        self._routes = table
        self.loaded = True
        metrics.ROUTES.set(len(table))
        metrics.routes_declared(list(table.values()))
        metrics.ROUTE_REFRESH.labels("ok").inc()
        async with self._changed:
            self.version += 1
            self._changed.notify_all()
