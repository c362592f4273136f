"""The reconciler (docs/reconcile.md): proves, route by route, that nothing the sender sent is missing.

It runs inside the ingress process because receipts are the ingress' to write (the sole-writer table,
tests/test_import_contract.py; docs/adr/015-reconciliation.md): a missing delivery is admitted by
submitting it to this process's own ``ReceiptWriter`` — the same group commit, the same ``INSERT … ON
CONFLICT (namespace, idempotency_key) DO NOTHING`` as a webhook — so a webhook and its reconciled copy
racing each other make exactly one receipt.

One leader across every ingress process and replica: a session advisory lock
``(RECONCILE_LOCK_CLASS, 0)`` tried on the reconciler's own connection every tick (the retention and
upkeep pattern); a process killed with -9 loses it with its connection. The state it writes
(watermark, checkpoint) goes through that same connection, so a process that lost the lock cannot
write it: the statement fails with the connection.

A pass over one route (``run_pass``):

1. bounds, whole seconds: ``since`` = the watermark (never more than ``window`` back; the day the
   route was first reconciled when there is none), ``until`` = now - ``lag``. An interrupted pass
   resumes with its own bounds from the cursor of the page after the last one it finished;
2. page by page (``Provider.pages``): one batched lookup of the page's idempotency keys
   (``receipt_keys_present``, the unique index), then for the missing ids either ``pull`` — the body
   (a pointer into the item, or one fetch per item), the route's own envelope extraction over it and
   the headers the item maps, a ``PendingReceipt`` with ``origin = 'reconciled'`` and
   ``verification = "fetched from <host> with key reference <ref>"``; the page's receipts submitted
   together and awaited — or ``redeliver`` — one request per missing id;
3. a checkpoint after each page (one statement); at the end of a clean pass the watermark moves to
   ``until``. A fault ends the pass with its class (metrics, one log line, the state's
   ``last_error_class``); the watermark stays at what was verified, the checkpoint at the last page
   finished.

On-demand runs (``connector admin reconcile``): rows of ``connector_reconcile_run`` the admin API
inserted; the leader takes them each tick, runs one pass over the asked bounds (``--since``; a dry
run lists and compares only) without moving the watermark, and writes the result on the row.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import aiohttp
import psycopg

from connector.common.core.background import BackgroundJob, session_lock_try
from connector.common.packs.jsonvalues import pointer_tokens, resolve_tokens, scalar_text
from connector.common.store import reconcile as store
from connector.common.store.receipts.insert import receipt_keys_present
from connector.ingress import metrics
from connector.ingress.admission import parse_json, receipt_key
from connector.ingress.receipts import CommitResult, PendingReceipt, ReceiptWriter, Unavailable
from connector.ingress.reconcile.provider import Item, Provider, ProviderError
from connector.ingress.routes import CompiledRoute, RouteTable

log = logging.getLogger("connector.ingress.reconcile")

ORIGIN: Final = "reconciled"
#: A receipt could not be made durable (the ingress' own failure reasons are in the detail).
DB_UNAVAILABLE: Final = "db_unavailable"
#: The route's extraction gives a reconciled copy another delivery id than the sender's list.
ID_MISMATCH: Final = "id_mismatch"
#: An on-demand run for a route that is not active or not reconciled.
NOT_RECONCILED: Final = "not_reconciled"
#: A failed pass is tried again this long after it (or after its interval, when shorter).
RETRY_FAILED_S: Final = 60.0
#: Missing delivery ids kept on a result (what a dry run prints).
MISSING_SAMPLE: Final = 20


@dataclass
class PassResult:
    namespace: str
    route_key: str
    since: float
    until: float
    mode: str = ""
    listed: int = 0
    missing: int = 0
    admitted: int = 0
    redelivered: int = 0
    pages: int = 0
    error_class: str | None = None
    error: str | None = None
    missing_ids: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.error_class is None


class PassFailed(Exception):
    def __init__(self, error_class: str, detail: str) -> None:
        super().__init__(detail)
        self.error_class = error_class
        self.detail = detail


#: How often the leader deletes on-demand runs older than ``store.RUN_KEEP_S`` (seconds).
RUN_PRUNE_S: Final = 3600.0


class Reconciler(BackgroundJob):
    kind = "reconciler"

    def __init__(
        self,
        url: str,
        routes: RouteTable,
        writer: ReceiptWriter,
        *,
        owner: str,
        tick_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(url, "ingress", interval_s=tick_s, jitter=0.1)
        self.routes = routes
        self.writer = writer
        self.owner = owner
        self.clock = clock
        self.leader = False
        self._session: aiohttp.ClientSession | None = None
        #: Passes finished (clean or not) by this process; tests wait on it.
        self.passes = 0
        self.results: list[PassResult] = []
        #: When this process last deleted old on-demand runs (monotonic; at most once per
        #: ``RUN_PRUNE_S``, the first time when it becomes the leader).
        self._pruned_at: float | None = None
        self._passed = asyncio.Condition()

    async def close(self) -> None:
        if self.leader:
            self.leader = False  # the lock goes with the connection
            metrics.RECONCILE_LEADER.set(0)
        await super().close()

    async def stop(self) -> None:
        await super().stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def on_failure(self, exc: BaseException) -> None:
        log.warning("reconciler round failed; retried next tick", extra={"error_class": type(exc).__name__})

    async def wait_passes(self, count: int) -> None:
        """Until this process has finished ``count`` passes (tests bound the wait)."""
        async with self._passed:
            await self._passed.wait_for(lambda: self.passes >= count)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(trust_env=False)
        return self._session

    # -- the tick --------------------------------------------------------------------------------

    async def run_once(self) -> None:
        routes = {(r.namespace, r.route_key): r for r in self.routes.all() if r.reconcile is not None}
        if not routes:
            # Nothing to reconcile: no connection, no statement, no lock held (and on-demand runs are
            # for reconciled routes only, so none can be waiting for this process).
            await self.close()
            return
        conn = await self.connection()
        if not self.leader:
            self.leader = await session_lock_try(conn, store.RECONCILE_LOCK_CLASS, 0)
            metrics.RECONCILE_LEADER.set(1 if self.leader else 0)
        if self.leader:
            await store.reconcile_state_ensure(conn, list(routes))
        states = {(s.namespace, s.route_key): s for s in await store.reconcile_state_list(conn)}
        self._export(routes, states)
        if not self.leader:
            return
        for run in await store.reconcile_run_claim(conn, owner=self.owner):
            await self._run_on_demand(conn, routes, run)
        mono = time.monotonic()
        if self._pruned_at is None or mono - self._pruned_at >= RUN_PRUNE_S:
            self._pruned_at = mono
            await store.reconcile_run_delete_old(conn)
        now = self.clock()
        for key, route in routes.items():
            state = states.get(key)
            assert route.reconcile is not None
            if self._due(route.reconcile.interval, state, now):
                await self.run_pass(conn, route, state)

    @staticmethod
    def _due(interval: float, state: store.ReconcileState | None, now: float) -> bool:
        """Never passed; a pass was interrupted (its checkpoint is there and no fault ended it):
        resume now; the last pass failed: again after ``RETRY_FAILED_S`` (at most its interval);
        else once its interval has gone by."""
        if state is None or state.last_pass_at is None:
            return True
        if state.last_error_class is None:
            return state.pass_until is not None or now - state.last_pass_at >= interval
        return now - state.last_pass_at >= min(interval, RETRY_FAILED_S)

    def _export(
        self, routes: dict[tuple[str, str], CompiledRoute], states: dict[tuple[str, str], Any]
    ) -> None:
        """Every process exports every reconciled route's state as the database has it (so the
        gauges do not depend on which process leads)."""
        now = self.clock()
        for key in routes:
            state = states.get(key)
            if state is None:
                continue
            last = state.last_clean_pass_at if state.last_clean_pass_at is not None else state.created_at
            metrics.RECONCILE_LAST_CLEAN.labels(*key).set(last)
            mark = state.watermark if state.watermark is not None else state.created_at
            metrics.RECONCILE_WATERMARK_AGE.labels(*key).set(max(0.0, now - mark))

    async def _run_on_demand(
        self,
        conn: psycopg.AsyncConnection[Any],
        routes: dict[tuple[str, str], CompiledRoute],
        run: dict[str, Any],
    ) -> None:
        route = routes.get((run["namespace"], run["route_key"]))
        if route is None:
            result = PassResult(
                run["namespace"],
                run["route_key"],
                0.0,
                0.0,
                error_class=NOT_RECONCILED,
                error="the route is not active or declares no (usable) reconcile",
            )
        else:
            result = await self.run_pass(
                conn, route, None, since=run["since"], dry_run=bool(run["dry_run"]), adhoc=True
            )
        await store.reconcile_run_finish(
            conn,
            int(run["run_id"]),
            state="done" if result.clean else "failed",
            result=json.dumps(asdict(result)),
        )

    # -- one pass --------------------------------------------------------------------------------

    async def run_pass(
        self,
        conn: psycopg.AsyncConnection[Any],
        route: CompiledRoute,
        state: store.ReconcileState | None,
        *,
        since: float | None = None,
        dry_run: bool = False,
        adhoc: bool = False,
    ) -> PassResult:
        """One pass over ``route``. ``adhoc`` (an operator's run, ``since`` / ``dry_run``): the
        watermark and the checkpoint are not its to move."""
        spec = route.reconcile
        assert spec is not None
        now = self.clock()
        floor = math.ceil(now - spec.window)
        hi = math.floor(now - spec.lag)
        resume: str | None = None
        if adhoc:
            lo = max(math.floor(since), floor) if since is not None else floor
        elif state is not None and state.pass_until is not None and state.pass_since is not None:
            lo, hi, resume = max(int(state.pass_since), floor), int(state.pass_until), state.pass_cursor
        else:
            start = state.watermark if state is not None and state.watermark is not None else None
            if start is None:
                start = state.created_at if state is not None else now
            lo = max(math.floor(start), floor)
        result = PassResult(route.namespace, route.route_key, float(lo), float(hi), mode=spec.mode)
        started = time.perf_counter()
        provider: Provider | None = None
        try:
            if hi > lo:
                provider = Provider(spec, self.session())
                await self._pages(conn, route, provider, result, resume, dry_run=dry_run, adhoc=adhoc)
            if not adhoc:
                await store.reconcile_state_finish(
                    conn,
                    route.namespace,
                    route.route_key,
                    until=hi,
                    listed=result.listed,
                    missing=result.missing,
                    admitted=result.admitted + result.redelivered,
                )
        except (ProviderError, PassFailed) as exc:
            result.error_class, result.error = exc.error_class, exc.detail
        rate_limited = provider.rate_limited if provider is not None else 0
        metrics.reconcile_observe(result, time.perf_counter() - started, rate_limited)
        if result.error_class is not None:
            log.warning(
                "reconcile pass failed",
                extra={
                    "namespace": route.namespace,
                    "route": route.route_key,
                    "error_class": result.error_class,
                    "problem": result.error,
                    "pages": result.pages,
                    "listed": result.listed,
                    "admitted": result.admitted,
                },
            )
            if not adhoc:
                await store.reconcile_state_fail(
                    conn,
                    route.namespace,
                    route.route_key,
                    error_class=result.error_class,
                    error=result.error or "",
                )
        elif result.missing:
            log.info(
                "reconcile pass found gaps",
                extra={
                    "namespace": route.namespace,
                    "route": route.route_key,
                    "missing": result.missing,
                    "admitted": result.admitted,
                    "redelivered": result.redelivered,
                    "dry_run": dry_run,
                },
            )
        async with self._passed:
            self.passes += 1
            self.results.append(result)
            del self.results[:-50]
            self._passed.notify_all()
        return result

    async def _pages(
        self,
        conn: psycopg.AsyncConnection[Any],
        route: CompiledRoute,
        provider: Provider,
        result: PassResult,
        resume: str | None,
        *,
        dry_run: bool,
        adhoc: bool,
    ) -> None:
        spec = route.reconcile
        assert spec is not None
        seen: set[str] = set()
        lo, hi = int(result.since), int(result.until)
        async for page in provider.pages(lo, hi, resume):
            result.pages += 1
            fresh = []
            for item in page.items:  # a sender may list one delivery more than once (attempts)
                if item.id not in seen:
                    seen.add(item.id)
                    fresh.append(item)
            result.listed += len(fresh)
            missing = await self._missing(conn, route, fresh)
            result.missing += len(missing)
            room = MISSING_SAMPLE - len(result.missing_ids)
            result.missing_ids.extend(i.id for i in missing[: max(room, 0)])
            if missing and not dry_run:
                if spec.mode == "pull":
                    result.admitted += await self._admit(route, provider, missing)
                else:
                    for item in missing:
                        await provider.redeliver(item)
                        result.redelivered += 1
            if not adhoc:
                await store.reconcile_state_checkpoint(
                    conn,
                    route.namespace,
                    route.route_key,
                    since=lo,
                    until=hi,
                    cursor=page.next,
                    listed=result.listed,
                    missing=result.missing,
                    admitted=result.admitted + result.redelivered,
                )

    async def _missing(
        self, conn: psycopg.AsyncConnection[Any], route: CompiledRoute, items: list[Item]
    ) -> list[Item]:
        if not items:
            return []
        keys = [receipt_key(route.route_key, i.id) for i in items]
        present = await receipt_keys_present(conn, route.namespace, keys)
        return [i for i, k in zip(items, keys, strict=True) if k not in present]

    async def _admit(self, route: CompiledRoute, provider: Provider, items: list[Item]) -> int:
        """Admit a page's missing deliveries through the ingress' own group commit; how many were
        new (a webhook that won the race answers as a duplicate)."""
        verification = (
            f"fetched from {provider.host} with key reference {', '.join(provider.key_refs) or 'none'}"
        )
        futures: list[asyncio.Future[CommitResult]] = []
        try:
            for item in items:
                body = await provider.body_of(item)
                futures.append(self.writer.submit(self._pending(route, item, body, verification)))
        except Unavailable as exc:
            raise PassFailed(
                DB_UNAVAILABLE, f"the ingress refused to queue a receipt ({exc.reason})"
            ) from None
        finally:
            results = await asyncio.gather(*futures)
        for res in results:
            if res.failure is not None:
                raise PassFailed(DB_UNAVAILABLE, f"a receipt could not be made durable ({res.failure})")
        return sum(1 for r in results if not r.duplicate)

    def _pending(self, route: CompiledRoute, item: Item, body: bytes, verification: str) -> PendingReceipt:
        """The receipt a webhook of this delivery would have made: the route's own extraction over
        the body and the headers the item maps (the route's idempotency header carries the item's
        id); the delivery id must come out as the sender's list says."""
        spec = route.reconcile
        assert spec is not None
        headers: dict[str, str] = {}
        for name, pointer in spec.item.headers.items():
            value = scalar_text(resolve_tokens(item.raw, pointer_tokens(pointer)))
            if value is not None:
                headers[name.lower()] = value
        if route.idempotency_header is not None:
            headers[route.idempotency_header.lower()] = item.id
        try:
            doc = parse_json(body)
        except ValueError:
            doc = None
        delivery_id = headers.get(route.idempotency_header.lower()) if route.idempotency_header else None
        event_kind: str | None = None
        correlation = "{}"
        if route.envelope is not None:
            event_kind, extracted, ids = route.envelope(lambda n: headers.get(n.lower()), doc)
            delivery_id = delivery_id or extracted
            if ids:
                correlation = json.dumps(ids, separators=(",", ":"), sort_keys=True)
        if delivery_id != item.id:
            raise PassFailed(
                ID_MISMATCH,
                "the route's extraction gives a reconciled copy another delivery id than the sender's list "
                "(reconcile.item.id must be the id a webhook of this route carries)",
            )
        return PendingReceipt(
            namespace=route.namespace,
            route_key=route.route_key,
            route_id=route.route_id,
            route_version=route.route_version,
            provider_delivery_id=item.id,
            idempotency_key=receipt_key(route.route_key, item.id),
            method=route.method,
            content_type="application/json",
            event_kind=event_kind,
            received_at=self.clock(),
            correlation_ids=correlation,
            payload_sha256=hashlib.sha256(body).digest(),
            body=body,
            verification=verification,
            origin=ORIGIN,
        )
