"""Materialization: from a claimed receipt and its route to an event and its WorkItems, and their
insert — one module for the routing loop, the backfill and the cutover (docs/adr/004-materializer.md).

* **Plan** (pure): a route is compiled once per route id (``compile_route``, the extraction language
  of ``connector.common.packs.extraction``; header values come from what the ingress stored on the
  receipt). ``plan_receipt`` gives an ``EventDraft`` (event fields, companion, correlation ids and one
  ``WorkDraft`` per fan-out entry with its lane keys) or a ``Failure`` whose summary names fields and
  rules, never a value. A missing required field, a lane key that cannot be formed or a body that is
  not JSON are permanent failures.
* **Schedule** (pure, part of the plan): a work type's ``delay`` (``packs.DelayPolicy``, the fan-out
  entry's override first) gives each WorkItem its first ``run_after``, counted from the receipt's
  ``accepted_at`` (the database clock; a backfill or cutover counts from the same instant, not its
  own time). A ``run_after`` taken from the route's ``extract.run_after`` is clamped to ``max_s``
  after acceptance; a missing or unreadable one falls back to the fixed delay. Nothing here fails a
  receipt: a bad value from a sender schedules the item, it never blocks the delivery.
* **Insert** (``materialize``, inside the caller's transaction): lock the batch's lanes (sorted),
  check whether a late earlier delivery overtakes a lane, insert events and WorkItems with multi-row
  statements (``ON CONFLICT (event_id, work_type) DO NOTHING``: a retried batch never duplicates
  work), settle the lanes (ADR 003), notify executors.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncConnection

from connector.common.packs import extraction
from connector.common.packs.extraction import (
    Context,
    Getter,
    compile_template,
    compile_value,
    dependency_order,
    instant_seconds,
    references,
    template_reads_body,
)
from connector.common.packs.jsonvalues import scalar_text
from connector.common.packs.manifest import (
    CircuitBreaker,
    ConcurrencyLimit,
    DebouncePolicy,
    DelayPolicy,
    RateLimit,
    canonical_json,
    circuit_target,
)
from connector.common.packs.references import DEFAULT_SOURCE_LANE_KEY, HEADER_FIELDS
from connector.common.packs.routes import ActivePack, ActiveRoute
from connector.common.store import events
from connector.common.store.circuits import CircuitKey, circuit_declare
from connector.common.store.debounce import DebounceKey, debounce_declare, debounce_schedule
from connector.common.store.flow import RateKey, SlotKey, concurrency_declare, rate_limit_declare
from connector.common.store.lanes import Lane, lane_lock_batch, lane_overtaken, lane_settle_batch
from connector.common.store.receipts.routing import ReceiptRow
from connector.common.store.work_items.finalize import work_notify
from connector.common.store.work_items.insert import WorkRow, work_item_insert_batch

#: Longest extracted value kept (object ids, kinds, correlation ids).
#: Longest lane key, in UTF-8 bytes (lane keys are indexed; a btree entry must stay well under 2.7 kB).
MAX_LANE_KEY_BYTES = 1024

# Failure classes (a fixed vocabulary: metric labels and ``error_class`` values).
NO_ROUTE = "no_route"
PARSE_ERROR = "parse_error"
REQUIRED_MISSING = "required_missing"
ROUTE_UNAVAILABLE = "route_unavailable"
BODY_UNAVAILABLE = "body_unavailable"
NO_CLAIM_AUTHORITY = "no_claim_authority"
ATTEMPTS_EXHAUSTED = "attempts_exhausted"
DB_ERROR = "db_error"
INTERNAL = "internal"
PERMANENT = frozenset({NO_ROUTE, PARSE_ERROR, REQUIRED_MISSING, ATTEMPTS_EXHAUSTED})
FAILURE_CLASSES = (
    NO_ROUTE, PARSE_ERROR, REQUIRED_MISSING, ROUTE_UNAVAILABLE, BODY_UNAVAILABLE, NO_CLAIM_AUTHORITY,
    ATTEMPTS_EXHAUSTED, DB_ERROR, INTERNAL,
)  # fmt: skip


# How a WorkItem's first run_after was chosen (a fixed vocabulary: the ``outcome`` label of
# ``connector_materializer_scheduled_total``).
SCHEDULE_DELAY = "delay"  # the fixed delay (no run_after field, or none extracted)
SCHEDULE_RUN_AFTER = "run_after"  # the extracted run_after, within the bound
SCHEDULE_PAST = "past"  # the extracted run_after had passed: runs now
SCHEDULE_CLAMPED = "clamped"  # the extracted run_after was beyond max_s: runs at the bound
SCHEDULE_INVALID = "invalid"  # extracted, but not an instant: the fixed delay instead
SCHEDULE_OUTCOMES = (SCHEDULE_DELAY, SCHEDULE_RUN_AFTER, SCHEDULE_PAST, SCHEDULE_CLAMPED, SCHEDULE_INVALID)


@dataclass(frozen=True, slots=True)
class WorkDraft:
    work_type: str
    queue_class: str
    priority: int
    max_attempts: int
    source_lane_key: str | None
    target_lane_key: str | None
    dead_blocks_lane: bool
    #: Not runnable before this instant (a delay); ``None``: as soon as it is inserted.
    run_after: datetime | None = None
    #: How ``run_after`` was chosen (``SCHEDULE_*``); ``None`` without a delay policy.
    schedule: str | None = None
    #: Rate-limit key and its limit (docs/adr/011-rate-limits.md); None: unlimited.
    rate_key: str | None = None
    rate_limit: RateLimit | None = None
    #: Concurrency key and its limit; None: unlimited.
    concurrency_key: str | None = None
    concurrency: ConcurrencyLimit | None = None
    #: Debounce key and its window (docs/packs.md#debounce); None: not debounced.
    debounce_key: str | None = None
    debounce: DebouncePolicy | None = None
    #: Circuit key (the handler target) and its breaker policy; None: no breaker.
    circuit_key: str | None = None
    circuit: CircuitBreaker | None = None
    #: Head start in the claim order (docs/adr/014-priorities.md; ``packs.priority_heads``).
    priority_head_s: float = 0.0


@dataclass(frozen=True, slots=True)
class EventDraft:
    """Everything needed to insert one receipt's event and WorkItems."""

    receipt: ReceiptRow
    pack: ActivePack
    route: ActiveRoute
    event_kind: str | None
    source_object_kind: str | None
    source_object_id: str | None
    companion: Mapping[str, str]
    correlation_ids: Mapping[str, str]
    #: Empty when the generation's claim path is the legacy Event path (the event is legacy-owned).
    work: tuple[WorkDraft, ...]
    legacy_owned: bool

    @property
    def has_lanes(self) -> bool:
        return any(w.source_lane_key is not None or w.target_lane_key is not None for w in self.work)


@dataclass(frozen=True, slots=True)
class Failure:
    receipt: ReceiptRow
    error_class: str
    #: Sanitized: fixed text, field names and manifest rules; never a payload value.
    summary: str

    @property
    def permanent(self) -> bool:
        return self.error_class in PERMANENT


Plan = EventDraft | Failure


# --------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------


def _stored_getter(field: str, correlation: str | None = None) -> Getter | None:
    """The value the ingress stored on the receipt for ``field`` (or a correlation id)."""
    if correlation is not None:
        return lambda ctx: scalar_text(ctx.receipt.correlation_ids.get(correlation))
    if field == "event_kind":
        return lambda ctx: ctx.receipt.event_kind
    if field == "delivery_id":
        return lambda ctx: ctx.receipt.provider_delivery_id
    return None


# --------------------------------------------------------------------------------------------------
# Compiled routes
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkSpec:
    work_type: str
    queue_class: str
    priority: int
    max_attempts: int
    source_lane: Getter | None
    source_lane_template: str | None
    target_serialization: bool
    dead_blocks_lane: bool
    delay: DelayPolicy | None = None
    rate_key: Getter | None = None
    rate_limit: RateLimit | None = None
    concurrency_key: Getter | None = None
    concurrency: ConcurrencyLimit | None = None
    debounce_key: Getter | None = None
    debounce: DebouncePolicy | None = None
    #: The handler target's circuit (``packs.circuit_target``) when a breaker is declared.
    circuit_key: str | None = None
    circuit: CircuitBreaker | None = None
    #: Head start in the claim order (docs/adr/014-priorities.md; ``packs.priority_heads``).
    priority_head_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CompiledRoute:
    route_id: int
    fields: tuple[tuple[str, Getter], ...]  # dependency order
    correlation: tuple[tuple[str, Getter], ...]
    required: tuple[str, ...]
    work: tuple[WorkSpec, ...]
    reads_body: bool


def compile_route(route: ActiveRoute) -> CompiledRoute:
    spec = route.spec
    fields: list[tuple[str, Getter]] = []
    reads_body = spec.content == "json"
    for name in dependency_order(spec.extract):
        value = spec.extract[name]
        fields.append((name, compile_value(value, _stored_getter(name))))
        reads_body = reads_body or extraction.reads_body(value)
    # Fields the ingress stored fall back to the receipt when the route has no spec for them.
    for name in HEADER_FIELDS:
        if name not in spec.extract:
            fallback = _stored_getter(name)
            assert fallback is not None
            fields.append((name, fallback))
    correlation: list[tuple[str, Getter]] = []
    for cname, cspec in sorted(spec.correlation.items()):
        correlation.append((cname, compile_value(cspec, _stored_getter("", correlation=cname))))
        reads_body = reads_body or extraction.reads_body(cspec)
    work: list[WorkSpec] = []
    for fan in spec.fan_out:
        wt = route.work_types[fan.work_type]
        lanes = fan.lanes or wt.lanes
        template = (lanes.source_lane_key or DEFAULT_SOURCE_LANE_KEY) if lanes.source_fifo else None
        if template is not None and template_reads_body(template):
            reads_body = True
        rate = fan.rate_limit or wt.rate_limit
        if rate is not None and template_reads_body(rate.key):
            reads_body = True
        conc = fan.concurrency or wt.concurrency
        if conc is not None and template_reads_body(conc.key):
            reads_body = True
        deb = fan.debounce or wt.debounce
        if deb is not None and template_reads_body(deb.key):
            reads_body = True
        breaker = fan.circuit_breaker or wt.circuit_breaker
        work.append(
            WorkSpec(
                work_type=fan.work_type,
                queue_class=wt.queue_class,
                priority=wt.priority,
                priority_head_s=route.priority_heads.get(fan.work_type, 0.0),
                max_attempts=wt.retry.max_attempts,
                source_lane=compile_template(template, bounded=False) if template is not None else None,
                source_lane_template=template,
                target_serialization=lanes.target_serialization,
                dead_blocks_lane=lanes.dead_head == "block",
                delay=fan.delay or wt.delay,
                rate_key=compile_template(rate.key, bounded=False) if rate is not None else None,
                rate_limit=rate,
                concurrency_key=compile_template(conc.key, bounded=False) if conc is not None else None,
                concurrency=conc,
                debounce_key=compile_template(deb.key, bounded=False) if deb is not None else None,
                debounce=deb,
                circuit_key=circuit_target(wt.handler) if breaker is not None else None,
                circuit=breaker,
            )
        )
    return CompiledRoute(
        route_id=route.route_id,
        fields=tuple(fields),
        correlation=tuple(correlation),
        required=spec.required,
        work=tuple(work),
        reads_body=reads_body,
    )


class RouteCompiler:
    """Compiled routes by route id (route rows are immutable, so entries never go stale)."""

    def __init__(self) -> None:
        self._compiled: dict[int, CompiledRoute] = {}

    def get(self, route: ActiveRoute) -> CompiledRoute:
        compiled = self._compiled.get(route.route_id)
        if compiled is None:
            if len(self._compiled) > 10_000:
                self._compiled.clear()
            compiled = self._compiled[route.route_id] = compile_route(route)
        return compiled


# --------------------------------------------------------------------------------------------------
# Planning one receipt
# --------------------------------------------------------------------------------------------------


def plan_receipt(
    receipt: ReceiptRow,
    pack: ActivePack | None,
    route: ActiveRoute | None,
    compiled: CompiledRoute | None,
) -> Plan:
    """The event draft of ``receipt`` under the active route, or why there is none."""
    if pack is None or (route is None and pack.problem is None):
        return Failure(receipt, NO_ROUTE, f"no route {receipt.route_key!r} in the active pack generation")
    if pack.problem is not None:
        return Failure(receipt, ROUTE_UNAVAILABLE, f"active pack generation unavailable ({pack.problem})")
    if pack.claim_path is None:
        return Failure(receipt, NO_CLAIM_AUTHORITY, "active pack generation has no claim authority")
    assert route is not None and compiled is not None
    doc: Any = None
    if compiled.reads_body:
        if receipt.body is None:
            return Failure(receipt, BODY_UNAVAILABLE, "receipt body is not stored inline (body_ref)")
        try:
            doc = json.loads(receipt.body)
        except (ValueError, UnicodeDecodeError):
            if route.spec.content == "json":
                return Failure(receipt, PARSE_ERROR, "body is not valid JSON")
            doc = None  # ``content: any``: pointers find nothing
    ctx = Context(doc, receipt=receipt)
    for name, getter in compiled.fields:
        if name not in ctx.values or ctx.values[name] is None:
            ctx.values[name] = getter(ctx)
    values = ctx.values
    missing = [name for name in compiled.required if values.get(name) is None]
    if missing:
        return Failure(
            receipt, REQUIRED_MISSING, f"required field(s) {missing} missing or not a usable scalar"
        )
    correlation: dict[str, str] = {
        str(k): v for k, v in receipt.correlation_ids.items() if isinstance(v, str)
    }
    for cname, getter in compiled.correlation:
        value = getter(ctx)
        if value is not None:
            correlation[cname] = value
    legacy_owned = _legacy_owned(pack)
    work: list[WorkDraft] = []
    if not legacy_owned:
        for spec in compiled.work:
            source_key: str | None = None
            if spec.source_lane is not None:
                ctx.work_type = spec.work_type
                source_key = spec.source_lane(ctx)
                if (failure := _lane_key_failure(receipt, spec, "source", source_key)) is not None:
                    return failure
            target_key: str | None = None
            if spec.target_serialization:
                target_key = values.get("target_lane_key")
                if (failure := _lane_key_failure(receipt, spec, "target", target_key)) is not None:
                    return failure
            run_after, schedule = (
                schedule_run_after(spec.delay, receipt.accepted_at, values.get("run_after"))
                if spec.delay is not None
                else (None, None)
            )
            rate_key: str | None = None
            if spec.rate_key is not None:
                ctx.work_type = spec.work_type
                rate_key = spec.rate_key(ctx)
                if (failure := _lane_key_failure(receipt, spec, "rate", rate_key)) is not None:
                    return failure
            concurrency_key: str | None = None
            if spec.concurrency_key is not None:
                ctx.work_type = spec.work_type
                concurrency_key = spec.concurrency_key(ctx)
                if (failure := _lane_key_failure(receipt, spec, "concurrency", concurrency_key)) is not None:
                    return failure
            debounce_key: str | None = None
            if spec.debounce_key is not None:
                ctx.work_type = spec.work_type
                debounce_key = spec.debounce_key(ctx)
                if (failure := _lane_key_failure(receipt, spec, "debounce", debounce_key)) is not None:
                    return failure
            work.append(
                WorkDraft(
                    work_type=spec.work_type,
                    queue_class=spec.queue_class,
                    priority=spec.priority,
                    priority_head_s=spec.priority_head_s,
                    max_attempts=spec.max_attempts,
                    source_lane_key=source_key,
                    target_lane_key=target_key,
                    dead_blocks_lane=spec.dead_blocks_lane,
                    run_after=run_after,
                    schedule=schedule,
                    rate_key=rate_key,
                    rate_limit=spec.rate_limit if rate_key is not None else None,
                    concurrency_key=concurrency_key,
                    concurrency=spec.concurrency if concurrency_key is not None else None,
                    debounce_key=debounce_key,
                    debounce=spec.debounce if debounce_key is not None else None,
                    circuit_key=spec.circuit_key,
                    circuit=spec.circuit,
                )
            )
    return EventDraft(
        receipt=receipt,
        pack=pack,
        route=route,
        event_kind=values.get("event_kind"),
        source_object_kind=values.get("source_object_kind"),
        source_object_id=values.get("source_object_id"),
        companion={name: v for name in compiled.required if (v := values.get(name)) is not None},
        correlation_ids=correlation,
        work=tuple(work),
        legacy_owned=legacy_owned,
    )


def schedule_run_after(
    delay: DelayPolicy, accepted_at: float | None, extracted: str | None
) -> tuple[datetime | None, str | None]:
    """The first ``run_after`` of a WorkItem under ``delay`` and how it was chosen (``SCHEDULE_*``).

    The base is the receipt's ``accepted_at`` (Unix seconds; ``None`` only for a receipt built
    outside the store: the current time then). An extracted instant wins over the fixed delay when
    it is readable; it is clamped to ``accepted_at + max_s``; one in the past gives ``None`` (runs
    now). Never raises."""
    base = accepted_at if accepted_at is not None else time.time()
    fixed = _instant(base + delay.fixed_s) if delay.fixed_s > 0 else None
    if not delay.run_after_field or extracted is None:
        return fixed, SCHEDULE_DELAY if fixed is not None else None
    wanted = instant_seconds(extracted)
    if wanted is None:
        return fixed, SCHEDULE_INVALID
    assert delay.max_s is not None  # the model requires it with run_after_field
    bound = base + delay.max_s
    if wanted > bound:
        return _instant(bound), SCHEDULE_CLAMPED
    if wanted <= base:
        return None, SCHEDULE_PAST
    return _instant(wanted), SCHEDULE_RUN_AFTER


def _instant(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _lane_key_failure(receipt: ReceiptRow, spec: WorkSpec, lane: str, key: str | None) -> Failure | None:
    """Why the ``lane`` (``source``/``target``) key of a work item cannot be used: it could not be
    formed (a required field is missing) or it is too long to index; ``None`` when it can."""
    if key is None:
        if lane == "source":
            refs = [r for r in references(spec.source_lane_template or "") if r != "work_type"]
            needs = f"source lane key needs {refs}"
        elif lane == "rate":
            template = spec.rate_limit.key if spec.rate_limit is not None else ""
            refs = [r for r in references(template) if r != "work_type"]
            needs = f"rate limit key needs {refs}"
        elif lane == "concurrency":
            template = spec.concurrency.key if spec.concurrency is not None else ""
            refs = [r for r in references(template) if r != "work_type"]
            needs = f"concurrency key needs {refs}"
        elif lane == "debounce":
            template = spec.debounce.key if spec.debounce is not None else ""
            refs = [r for r in references(template) if r != "work_type"]
            needs = f"debounce key needs {refs}"
        else:
            needs = "target serialization needs target_lane_key"
        return Failure(receipt, REQUIRED_MISSING, f"work type {spec.work_type!r}: {needs}")
    if len(key.encode()) > MAX_LANE_KEY_BYTES:
        what = {"rate": "rate limit key", "concurrency": "concurrency key", "debounce": "debounce key"}.get(
            lane, f"{lane} lane key"
        )
        return Failure(receipt, PARSE_ERROR, f"work type {spec.work_type!r}: {what} too long")
    return None


def _legacy_owned(pack: ActivePack) -> bool:
    """Events of a generation whose claims belong to the legacy Event path (``legacy_active``) get no
    WorkItems: the legacy path executes them, and backfill creates WorkItems for the unfinished ones
    at cutover. Every other phase gets WorkItems, executable only once the WorkItem path is admitted:
    ``quiescing`` (a cutover admits them, an abort fences them back to the legacy path),
    ``rollback_fenced`` (the rollback fence makes them ``awaiting_legacy_outcome``, an abort admits
    them) and ``work_item_active`` (docs/cutover.md)."""
    return pack.claim_path == "legacy_event"


def plan_batch(
    receipts: Sequence[ReceiptRow],
    lookup: Callable[[str, str], tuple[ActivePack | None, ActiveRoute | None]],
    compiler: RouteCompiler,
    *,
    max_attempts: int,
) -> list[Plan]:
    plans: list[Plan] = []
    for receipt in receipts:
        if receipt.attempts > max_attempts:
            plans.append(
                Failure(receipt, ATTEMPTS_EXHAUSTED, f"routing attempted {receipt.attempts - 1} times")
            )
            continue
        try:
            pack, route = lookup(receipt.namespace, receipt.route_key)
            compiled = compiler.get(route) if route is not None else None
            plans.append(plan_receipt(receipt, pack, route, compiled))
        except Exception as exc:  # a bug must not stall the batch: this receipt backs off
            plans.append(Failure(receipt, INTERNAL, f"unexpected {type(exc).__name__} while planning"))
    return plans


# --------------------------------------------------------------------------------------------------
# Insert: events and WorkItems in the caller's transaction
# --------------------------------------------------------------------------------------------------


def work_row(
    event_id: int,
    installed_pack_id: int,
    generation: int,
    delivery_seq: int,
    w: WorkDraft,
    traceparent: str | None = None,
    accepted_at: float | None = None,
) -> WorkRow:
    """The WorkItem row of one fan-out entry of an event (``traceparent``: the trace context its
    attempts continue, docs/tracing.md; ``accepted_at``: its receipt's, Unix seconds)."""
    return WorkRow(
        event_id=event_id,
        installed_pack_id=installed_pack_id,
        generation=generation,
        work_type=w.work_type,
        queue_class=w.queue_class,
        priority=w.priority,
        priority_head_s=w.priority_head_s,
        max_attempts=w.max_attempts,
        delivery_seq=delivery_seq,
        source_lane_key=w.source_lane_key,
        target_lane_key=w.target_lane_key,
        dead_blocks_lane=w.dead_blocks_lane,
        traceparent=traceparent,
        accepted_at=accepted_at,
        run_after=w.run_after,
        rate=None
        if w.rate_key is None or (r := w.rate_limit) is None
        else RateKey(installed_pack_id, w.rate_key, w.work_type, r.limit, r.period_s, r.burst),
        slot=None
        if w.concurrency_key is None or (c := w.concurrency) is None
        else SlotKey(installed_pack_id, w.concurrency_key, w.work_type, c.limit),
        debounce=None
        if w.debounce_key is None or (d := w.debounce) is None
        else DebounceKey(installed_pack_id, w.work_type, w.debounce_key, d.window_s, d.max_wait),
        circuit=None
        if w.circuit_key is None or (b := w.circuit) is None
        else CircuitKey(
            installed_pack_id,
            w.circuit_key,
            w.work_type,
            b.consecutive_failures,
            b.failure_ratio,
            b.window_s,
            b.min_outcomes,
            b.open_s,
            b.half_open_probes,
        ),
    )


def work_rows(
    drafts: Sequence[EventDraft],
    event_ids: Mapping[int, int],
    traceparents: Mapping[int, str | None] | None = None,
) -> list[WorkRow]:
    """The WorkItem rows of ``drafts`` in (delivery_seq, fan-out) order. Each carries the trace
    context in ``traceparents`` (by receipt id: the routing span's), else its receipt's."""
    return [
        work_row(
            event_ids[d.receipt.receipt_id],
            d.pack.installed_pack_id,
            d.pack.generation,
            d.receipt.receipt_id,
            w,
            traceparents[d.receipt.receipt_id] if traceparents else d.receipt.traceparent,
            d.receipt.accepted_at,
        )
        for d in sorted(drafts, key=lambda d: d.receipt.receipt_id)
        for w in d.work
    ]


def event_rows(drafts: Sequence[EventDraft], event_ids: Mapping[int, int]) -> list[tuple[Any, ...]]:
    """The event rows of ``drafts`` (``store.events.EVENT_COLUMNS`` order; ids keyed by receipt id)."""
    return [
        (
            event_ids[d.receipt.receipt_id],
            d.receipt.receipt_id,
            d.pack.installed_pack_id,
            d.pack.generation,
            d.pack.incarnation,
            d.route.route_id,
            d.route.route_version,
            d.receipt.namespace,
            d.event_kind,
            d.source_object_kind,
            d.source_object_id,
            f"{d.receipt.idempotency_key}#0",
            d.receipt.receipt_id,
            d.receipt.payload_sha256,
            canonical_json(dict(d.companion)),
            canonical_json(dict(d.correlation_ids)),
            "legacy_event" if d.legacy_owned else "work_item",
            "pending" if d.legacy_owned else None,
        )
        for d in drafts
    ]


@dataclass(frozen=True, slots=True)
class Materialized:
    work_items: int
    #: Lane members re-blocked because a late earlier delivery overtook them.
    demoted: int
    #: Lanes whose later member had already started when an earlier one arrived.
    inverted: int


async def materialize(
    conn: AsyncConnection[Any],
    drafts: Sequence[EventDraft],
    event_ids: Mapping[int, int],
    rows: Sequence[WorkRow],
) -> Materialized:
    """Inside the caller's transaction: lock the lanes of ``rows`` (sorted), check for overtaken
    lanes, insert the events of ``drafts`` and the WorkItem ``rows``, settle the lanes, notify
    executors when a WorkItem was created. ``drafts`` is empty for a backfill (events exist)."""
    first_seq: dict[Lane, int] = {}  # each lane -> its smallest new delivery_seq
    for w in rows:
        for lane in w.lanes:
            if lane not in first_seq or w.delivery_seq < first_seq[lane]:
                first_seq[lane] = w.delivery_seq
    locked = await lane_lock_batch(conn, sorted(first_seq)) if first_seq else []
    demote_lanes, inverted = await lane_overtaken(conn, first_seq) if first_seq else (0, 0)
    if drafts:
        await events.event_insert_batch(conn, event_rows(drafts, event_ids))
    rate_keys = [w.rate for w in rows if w.rate is not None]
    if rate_keys:
        await rate_limit_declare(conn, rate_keys)
    slot_keys = [w.slot for w in rows if w.slot is not None]
    if slot_keys:
        await concurrency_declare(conn, slot_keys)
    debounce_keys = [w.debounce for w in rows if w.debounce is not None]
    if debounce_keys:
        rows = await _debounced(conn, rows, debounce_keys)
    circuit_keys = [w.circuit for w in rows if w.circuit is not None]
    if circuit_keys:
        await circuit_declare(conn, circuit_keys)
    work_items = await work_item_insert_batch(conn, rows)
    demoted = 0
    if locked:
        settled = await lane_settle_batch(conn, locked, demote=demote_lanes > 0)
        demoted = settled.demoted
    if work_items:
        await work_notify(conn)
    return Materialized(work_items, demoted, inverted)


#: ``run_after`` of a debounced item that a newer one of its key already supersedes (vocabulary.PARKED).
_PARKED_AT = datetime(9999, 1, 1, tzinfo=UTC)


async def _debounced(
    conn: AsyncConnection[Any], rows: Sequence[WorkRow], keys: Sequence[DebounceKey]
) -> list[WorkRow]:
    """Lock the debounce keys of ``rows`` (before their items are inserted: per key, creation is
    one transaction at a time), park each key's live item, and give the new rows their
    ``run_after``: the last row of each key is due when ``debounce_schedule`` says (never earlier
    than its delay), the earlier rows of the batch are inserted parked (docs/packs.md#debounce)."""
    await debounce_declare(conn, keys)
    due = await debounce_schedule(conn, keys)
    last: dict[tuple[int, str, str], int] = {}
    for i, w in enumerate(rows):
        if w.debounce is not None:
            last[(w.installed_pack_id, w.work_type, w.debounce.debounce_key)] = i
    out = list(rows)
    for i, w in enumerate(rows):
        if w.debounce is None:
            continue
        key = (w.installed_pack_id, w.work_type, w.debounce.debounce_key)
        if last[key] != i:
            at = _PARKED_AT
        else:
            at = due[key] if w.run_after is None else max(due[key], w.run_after)
        out[i] = replace(w, run_after=at)
    return out
