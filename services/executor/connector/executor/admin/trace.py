"""TraceDelivery: one delivery's whole chain — receipt (verification, times, routing), its events,
and each WorkItem with its lanes and why it is not running now (docs/admin.md, "Trace").

Every read is one batched statement of the store (receipt, events, WorkItems, lane positions, claim
authorities, claimant count, and the pause rows of a paused pack), inside one read-only REPEATABLE
READ snapshot, so the parts agree with each other and with the database clock the waits compare
against (``observe_time``).

``why_not_running`` is the one place that decides a WorkItem's wait: an ordered table of small
checks (``WAIT_CHECKS``), each a condition and its reason; a new reason (a budget) is a new check in
its place there (beside the pause, before the ``run_after`` checks).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from connector.common.store import authority, events, processes, receipts, work_items
from connector.common.store import circuits as circuit_store
from connector.common.store import pauses as pause_store
from connector.common.store.lanes import LaneKind, LaneMember, lane_position_batch, lanes_of
from connector.common.store.receipts.find import DeliveryFilter
from connector.common.store.rows import snapshot_read_only
from connector.common.store.tokens import TOKEN_COUNTER_BITS
from connector.common.store.work_items.finalize import ATTEMPTS_KEPT
from connector.executor.admin import convert
from connector.executor.admin.auth import Principal
from connector.executor.admin.errors import Reason, invalid_argument, not_found, permission_denied
from connector.executor.admin.session import connection
from connector.v1 import admin_service_pb2 as pb

#: ``run_after`` of an item parked for a concurrency slot (``vocabulary.PARKED``).
PARKED_AT = datetime(9999, 1, 1, tzinfo=UTC)

#: ``<scheme>:<key reference>`` as the ingress stores it (ingress/verify.py), e.g.
#: ``hmac-sha256:env:SHOP_SECRET``; ``none`` without a key.
_VERIFICATION = re.compile(r"^([^:\s]+)[:\s](.+)$")


#: A reconciled receipt's label (connector.ingress.reconcile): where it was fetched and with which key.
_FETCHED = re.compile(r"^(fetched from \S+) with key reference (.+)$")


def verification_parts(label: str | None) -> tuple[str, str]:
    """(scheme, key reference) of a receipt's verification label (never a secret: a reference); a
    reconciled receipt's "scheme" is ``fetched from <host>``."""
    if not label:
        return "", ""
    fetched = _FETCHED.match(label)
    if fetched:
        return fetched.group(1), fetched.group(2)
    match = _VERIFICATION.match(label)
    return (match.group(1), match.group(2)) if match else (label, "")


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a stored W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``), or ``""``."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else ""


# --------------------------------------------------------------------------------------------------
# Why a WorkItem is not running now
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LaneView:
    """One lane of a WorkItem as ``store.lanes.lane_position_batch`` sees it."""

    kind: str  # LaneKind value
    key: str
    head_work_id: int | None
    head_state: str | None
    head_lease_owner: str | None
    head_run_after: datetime | None
    processing_work_id: int | None
    processing_lease_owner: str | None
    ahead: int


@dataclass(frozen=True, slots=True)
class Wait:
    reason: int  # types: pb.WaitReason
    detail: str
    until: datetime | None = None
    blocking_work_id: int = 0
    lease_owner: str = ""


def _lane_name(lane: LaneView) -> str:
    return f"{'source' if lane.kind == LaneKind.SOURCE else 'target'} lane {lane.key!r}"


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


def _blocked_wait(work_id: int, lanes: list[LaneView], now: datetime) -> Wait:
    for lane in lanes:
        if lane.head_work_id is not None and lane.head_work_id != work_id:
            state = lane.head_state or "?"
            head_after = lane.head_run_after
            scheduled = state == "pending" and head_after is not None and head_after > now
            why = {
                "processing": f"running on {lane.head_lease_owner or '?'}",
                "dead": "dead and holding its lanes (dead_head: block): replay it"
                " (connector admin dlq replay) to release them",
                "retry": f"in retry backoff until {_when(lane.head_run_after)}",
                "pending": f"waiting until {_when(head_after)} (delay)" if scheduled else "due next",
                "blocked": "itself blocked in another lane",
                "awaiting_legacy_outcome": "rollback-fenced awaiting its legacy outcome",
            }.get(state, state)
            return Wait(
                pb.WAIT_REASON_LANE_BLOCKED,
                f"blocked in {_lane_name(lane)} behind work item {lane.head_work_id} ({state}: {why});"
                f" {lane.ahead} member(s) ahead",
                blocking_work_id=lane.head_work_id,
                lease_owner=lane.head_lease_owner or "",
            )
    for lane in lanes:
        if lane.processing_work_id is not None and lane.processing_work_id != work_id:
            return Wait(
                pb.WAIT_REASON_LANE_BLOCKED,
                f"blocked in {_lane_name(lane)}: work item {lane.processing_work_id} is in flight on"
                f" {lane.processing_lease_owner or '?'}",
                blocking_work_id=lane.processing_work_id,
                lease_owner=lane.processing_lease_owner or "",
            )
    return Wait(
        pb.WAIT_REASON_LANE_BLOCKED,
        "blocked although first in each of its lanes: its promotion is pending (the lane repair"
        " promotes it within one upkeep interval)",
    )


def _circuit_wait(c: dict[str, Any], run_after: datetime | None, now: datetime) -> Wait | None:
    """CIRCUIT_OPEN while the item's circuit holds it back (``None``: closed, or a probe slot free)."""
    state, target = str(c["effective_state"]), c["circuit_key"]
    since = f" since {_when(c.get('changed_at'))} ({c.get('reason') or '-'})"
    if state == "closed":
        return None
    if state == "open" and c.get("forced"):
        who = f" by {c.get('actor') or '?'}: {convert.summary(c.get('note'))}"
        return Wait(
            pb.WAIT_REASON_CIRCUIT_OPEN,
            f"the circuit breaker of handler target {target!r} was opened{who}{since}; no attempt is"
            f" spent; connector admin circuit close to resume",
            until=run_after if run_after is not None and run_after > now else None,
        )
    if state == "open":
        until = c.get("open_until")
        return Wait(
            pb.WAIT_REASON_CIRCUIT_OPEN,
            f"the circuit breaker of handler target {target!r} is open{since}: probes from"
            f" {_when(until)}; no attempt is spent (connector admin circuit list)",
            until=until,
        )
    if int(c.get("probes_in_flight") or 0) >= int(c.get("half_open_probes") or 1):
        return Wait(
            pb.WAIT_REASON_CIRCUIT_OPEN,
            f"the circuit breaker of handler target {target!r} is half-open with its"
            f" {c.get('half_open_probes')} probe(s) in flight{since}: it waits for their outcome",
            until=run_after if run_after is not None and run_after > now else None,
        )
    if run_after is not None and run_after > now:
        # A probe slot is free, but this item is not due: the circuit held it back (its due time
        # moved to the end of the open period) — that, not a retry backoff, is why it waits.
        return Wait(
            pb.WAIT_REASON_CIRCUIT_OPEN,
            f"the circuit breaker of handler target {target!r} is {state.replace('_', '-')}{since}; it"
            f" held this item back until {_when(run_after)}, then it may run as a probe (no attempt"
            " is spent while it waits)",
            until=run_after,
        )
    return None


@dataclass(frozen=True, slots=True)
class _Item:
    """What the checks of ``why_not_running`` read: a WorkItem (a ``w_*`` row) and its context."""

    row: dict[str, Any]
    lanes: list[LaneView]
    claim_authority: dict[str, Any] | None
    active_claimants: int
    now: datetime
    pauses: dict[tuple[int, str], dict[str, Any]]
    circuits: dict[tuple[int, str], dict[str, Any]]

    @property
    def state(self) -> str:
        return str(self.row["w_state"])

    @property
    def work_id(self) -> int:
        return int(self.row["w_work_id"])

    @property
    def run_after(self) -> datetime | None:
        return self.row.get("w_run_after")

    @property
    def waits(self) -> bool:
        """``run_after`` is in the future."""
        return self.run_after is not None and self.run_after > self.now

    @property
    def parked(self) -> bool:
        """``run_after`` is the parking date (a concurrency slot or a debounce cover to wait for)."""
        return self.run_after is not None and self.run_after >= PARKED_AT


def _succeeded(i: _Item) -> Wait | None:
    if i.state != "succeeded":
        return None
    return Wait(pb.WAIT_REASON_SUCCEEDED, f"succeeded at {_when(i.row.get('w_finished_at'))}")


def _dead(i: _Item) -> Wait | None:
    if i.state != "dead":
        return None
    item = i.row
    holds = " It holds its lanes (dead_head: block)." if i.lanes and item.get("w_dead_blocks_lane") else ""
    return Wait(
        pb.WAIT_REASON_DEAD,
        f"dead after {item['w_attempts']} attempt(s): {item.get('w_failure_class') or '-'}:"
        f" {convert.summary(item.get('w_failure_summary'))}.{holds}"
        f" Replay: connector admin dlq replay {i.work_id}",
    )


def _cancelled(i: _Item) -> Wait | None:
    if i.state != "cancelled":
        return None
    return Wait(
        pb.WAIT_REASON_CANCELLED,
        f"cancelled at {_when(i.row.get('w_finished_at'))}:"
        f" {convert.summary(i.row.get('w_failure_summary'))}."
        f" Replay: connector admin dlq replay {i.work_id}",
    )


def _coalesced(i: _Item) -> Wait | None:
    if i.state != "coalesced":
        return None
    item = i.row
    cover = int(item.get("w_covered_by") or 0)
    how = (
        "whose execution had started before this one's retry came up (it overtook it; that"
        " handler was not told about this one)"
        if item.get("w_outcome") == "overtaken"
        else "whose execution covers it"
    )
    return Wait(
        pb.WAIT_REASON_COALESCED,
        f"coalesced at {_when(item.get('w_finished_at'))} into work item {cover}, a newer item of"
        f" debounce key {item.get('w_debounce_key')!r} {how} (it did not run again itself;"
        f" connector admin trace of {cover} shows that execution)",
        blocking_work_id=cover,
    )


#: The states of the legacy Event path's hand-over, each with its one answer.
_LEGACY_STATES: dict[str, tuple[int, str]] = {
    "reconciled_legacy_terminal": (
        pb.WAIT_REASON_LEGACY_TERMINAL,
        "executed by the legacy Event path; never runs on the WorkItem path",
    ),
    "awaiting_legacy_outcome": (
        pb.WAIT_REASON_AWAITING_LEGACY_OUTCOME,
        "rollback-fenced: waiting for the legacy Event path's outcome (docs/cutover.md)",
    ),
}


def _legacy(i: _Item) -> Wait | None:
    """Executed by the legacy path, or fenced until its outcome is known."""
    answer = _LEGACY_STATES.get(i.state)
    return Wait(*answer) if answer is not None else None


def _leased(i: _Item) -> Wait | None:
    """Running, or claimed by a holder whose lease ran out."""
    if i.state != "processing":
        return None
    owner = i.row.get("w_lease_owner") or ""
    until = i.row.get("w_lease_until")
    if until is not None and until <= i.now:
        return Wait(
            pb.WAIT_REASON_LEASE_EXPIRED,
            f"claimed by {owner or '?'} whose lease ran out at {_when(until)}: the holder is gone;"
            " the reclaim moves it to retry",
            until=until,
            lease_owner=owner,
        )
    return Wait(
        pb.WAIT_REASON_RUNNING,
        f"running on {owner or '?'} (attempt {i.row['w_attempts']}, lease until {_when(until)})",
        until=until,
        lease_owner=owner,
    )


def _lane_blocked(i: _Item) -> Wait | None:
    return _blocked_wait(i.work_id, i.lanes, i.now) if i.state == "blocked" else None


# From here on the item is ready (pending or retry): what keeps it from its claim, in claim order.


def owner_path(state: str, authority: dict[str, Any] | None) -> str:
    """The claim path that owns a WorkItem now (``WorkItemTrace.claim_path``): a rollback-fenced or
    legacy-reconciled item is the legacy path's, any other its generation's failure owner (the same
    rule as ``store.work_items.admin.WORK_ITEM_FAILURE_OWNED``)."""
    if state in ("awaiting_legacy_outcome", "reconciled_legacy_terminal"):
        return "legacy_event"
    a = authority or {}
    if a.get("claim_path") == "legacy_event" or a.get("phase") == "quiescing":
        return "legacy_event"
    return "work_item"


def _claim_path_closed(i: _Item) -> Wait | None:
    authority = i.claim_authority
    if authority is not None and authority.get("admits_work_items"):
        return None
    path = (authority or {}).get("claim_path") or "none"
    phase = (authority or {}).get("phase") or "none"
    return Wait(
        pb.WAIT_REASON_CLAIM_PATH_CLOSED,
        f"pack {i.row['w_installed_pack_id']} generation {i.row['w_generation']} does not admit"
        f" WorkItem claims (claim path {path}, phase {phase}; connector admin cutover status)",
    )


def _paused(i: _Item) -> Wait | None:
    item = i.row
    paused = set((i.claim_authority or {}).get("paused_queue_classes") or ())
    if not paused & {"*", item["w_queue_class"]}:
        return None
    whole = "*" in paused
    pause = i.pauses.get((int(item["w_installed_pack_id"]), "*" if whole else item["w_queue_class"]))
    why = ""
    if pause:
        who, at = pause.get("actor") or "?", _when(pause.get("paused_at"))
        why = f" by {who} at {at}: {convert.summary(pause.get('reason'))}"
    what = f"pack {item['w_installed_pack_id']}" if whole else f"queue class {item['w_queue_class']!r}"
    return Wait(
        pb.WAIT_REASON_PAUSED,
        f"{what} is paused{why}; claims skip it until connector admin resume",
    )


def _circuit_open(i: _Item) -> Wait | None:
    circuit = i.circuits.get((int(i.row["w_installed_pack_id"]), str(i.row.get("w_circuit_key"))))
    return _circuit_wait(circuit, i.run_after, i.now) if circuit is not None else None


def _concurrency_limited(i: _Item) -> Wait | None:
    if not (i.parked and i.row.get("w_concurrency_key") is not None):
        return None
    return Wait(
        pb.WAIT_REASON_CONCURRENCY_LIMITED,
        f"parked: concurrency key {i.row['w_concurrency_key']!r} has all its slots in flight;"
        " a finishing member wakes it (connector admin stats)",
    )


def _debounced(i: _Item) -> Wait | None:
    key = i.row.get("w_debounce_key")
    # A retry's own wait reads BACKOFF unless it is parked behind a newer item of its key.
    if key is None or not i.waits or not (i.state == "pending" or i.parked):
        return None
    if i.parked:
        return Wait(
            pb.WAIT_REASON_DEBOUNCED,
            f"debounced: parked behind a newer item of debounce key {key!r}, whose execution will"
            " cover it (it will end coalesced; connector admin stats shows the key)",
        )
    return Wait(
        pb.WAIT_REASON_DEBOUNCED,
        f"debounced: newest item of debounce key {key!r}, due at {_when(i.run_after)} unless a newer"
        " one arrives first (then it is covered by that one)",
        until=i.run_after,
    )


def _rate_limited(i: _Item) -> Wait | None:
    # A deferral rewrites the row (``updated_at`` moves past ``created_at``); an item that waits on its
    # work type's delay was never rewritten since it was inserted, rate key or not.
    created, updated = i.row.get("w_created_at"), i.row.get("w_updated_at")
    rewritten = created is None or updated is None or updated > created
    if not (i.waits and i.state == "pending" and i.row.get("w_rate_key") is not None and rewritten):
        return None
    return Wait(
        pb.WAIT_REASON_RATE_LIMITED,
        f"rate-limit key {i.row['w_rate_key']!r} has no budget before {_when(i.run_after)}"
        " (connector admin stats)",
        until=i.run_after,
    )


def _scheduled(i: _Item) -> Wait | None:
    """Pending with a future ``run_after``: only its work type's delay puts it there."""
    if not i.waits or i.state == "retry":
        return None
    item = i.row
    then = f"; then rate-limit key {item['w_rate_key']!r} applies" if item.get("w_rate_key") else ""
    return Wait(
        pb.WAIT_REASON_SCHEDULED,
        f"waiting until {_when(i.run_after)} (delay of work type {item.get('w_work_type')!r}){then}",
        until=i.run_after,
    )


def _backoff(i: _Item) -> Wait | None:
    if not i.waits:
        return None
    item = i.row
    last = (
        f" after {item.get('w_failure_class') or 'a failure'}"
        f" (attempt {item['w_attempts']} of {item['w_max_attempts']})"
    )
    return Wait(pb.WAIT_REASON_BACKOFF, f"retry backoff{last} until {_when(i.run_after)}", until=i.run_after)


def _no_claimant(i: _Item) -> Wait | None:
    if i.active_claimants > 0:
        return None
    return Wait(
        pb.WAIT_REASON_NO_CLAIMANT,
        "due, but no executor claiming WorkItems has a fresh heartbeat (connector admin processes)",
    )


def _due(i: _Item) -> Wait:
    item = i.row
    head = float(item.get("w_priority_head_s") or 0.0)
    ranked = (
        f" (priority {item.get('w_priority')}: ranked as if due {head:g} s earlier, docs/packs.md#priorities)"
        if head > 0
        else ""
    )
    return Wait(
        pb.WAIT_REASON_DUE,
        f"due since {_when(i.run_after)}{ranked}: the next claim with a free slot in queue class"
        f" {item['w_queue_class']!r} takes it in claim order",
    )


#: The checks of ``why_not_running`` in order; the first that answers decides (``_due`` otherwise).
#: Terminal and fenced states first, then the lease, then the lanes, then what keeps a ready item
#: from its claim, in the claim's own order. A new reason (a budget) goes into its place here.
WAIT_CHECKS: tuple[Callable[[_Item], Wait | None], ...] = (
    _succeeded,
    _dead,
    _cancelled,
    _coalesced,
    _legacy,
    _leased,
    _lane_blocked,
    _claim_path_closed,
    _paused,
    _circuit_open,
    _concurrency_limited,
    _debounced,
    _rate_limited,
    _scheduled,
    _backoff,
    _no_claimant,
)


def why_not_running(
    item: dict[str, Any],
    lanes: list[LaneView],
    claim_authority: dict[str, Any] | None,
    active_claimants: int,
    now: datetime,
    pauses: dict[tuple[int, str], dict[str, Any]] | None = None,
    circuits: dict[tuple[int, str], dict[str, Any]] | None = None,
) -> Wait:
    """Why the WorkItem ``item`` (a ``w_*`` row) is not running at ``now`` (the database clock), or
    that it is. ``lanes``: its lanes' positions; ``claim_authority``: its pack generation's
    (``store.authority.claim_authority_list``); ``active_claimants``: executors claiming WorkItems
    with a fresh heartbeat; ``pauses``: the pause rows by (pack, queue class or '*')
    (``store.pauses.pause_list``), for who paused and why; ``circuits``: the circuit rows of its
    handler target by (pack, target) (``store.circuits.circuit_get``).

    The first of ``WAIT_CHECKS`` that answers decides: terminal and fenced states, then the lease,
    then the lanes, then what keeps a ready item from its claim, in the claim's own order: claim
    path, pause, an open circuit breaker, a concurrency slot (parked), a debounce, a rate-limit
    budget (deferred), run_after, claimants; due otherwise.
    """
    case = _Item(item, lanes, claim_authority, active_claimants, now, pauses or {}, circuits or {})
    for check in WAIT_CHECKS:
        wait = check(case)
        if wait is not None:
            return wait
    return _due(case)


# --------------------------------------------------------------------------------------------------
# The receipt's routing
# --------------------------------------------------------------------------------------------------


def routing_detail(row: dict[str, Any], now: datetime) -> str:
    status = row["r_router_status"]
    error = f"{row.get('r_error_class') or '-'}: {convert.summary(row.get('r_error_summary'))}"
    due = row.get("r_next_attempt_at")
    if status == "pending":
        return f"waiting to be routed (due {_when(due)})"
    if status == "retry":
        return f"routing attempt {row['r_attempts']} failed ({error}); next attempt at {_when(due)}"
    if status == "routing":
        until = row.get("r_lease_until")
        if until is not None and until <= now:
            owner = row.get("r_claim_owner") or "?"
            return f"routing lease of {owner} expired at {_when(until)}; another claim takes it over"
        return f"being routed by {row.get('r_claim_owner') or '?'} (lease until {_when(until)})"
    if status == "failed":
        return (
            f"routing failed after {row['r_attempts']} attempt(s) ({error});"
            f" connector admin receipts replay {row['r_receipt_id']}"
        )
    n = len(row.get("r_enqueued_event_ids") or ())
    return f"routed at {_when(row.get('r_routed_at'))} into {n} event(s)"


# --------------------------------------------------------------------------------------------------
# The RPC
# --------------------------------------------------------------------------------------------------


def _lane_view(pos: dict[str, Any]) -> LaneView:
    return LaneView(
        kind=str(pos["kind"]),
        key=str(pos["key"]),
        head_work_id=pos["head_work_id"],
        head_state=pos["head_state"],
        head_lease_owner=pos["head_lease_owner"],
        head_run_after=pos["head_run_after"],
        processing_work_id=pos["processing_work_id"],
        processing_lease_owner=pos["processing_lease_owner"],
        ahead=int(pos["ahead"]),
    )


def _lane_pb(lane: LaneView) -> pb.LanePosition:
    return pb.LanePosition(
        kind=pb.LANE_KIND_SOURCE if lane.kind == LaneKind.SOURCE else pb.LANE_KIND_TARGET_MUTATION,
        lane_key=lane.key,
        head_work_id=lane.head_work_id or 0,
        head_state=convert.work_item_state(lane.head_state) if lane.head_state else 0,  # type: ignore[arg-type]
        processing_work_id=lane.processing_work_id or 0,
        ahead=lane.ahead,
    )


def check_request(request: pb.TraceDeliveryRequest, principal: Principal | None) -> None:
    given = [n for n in ("receipt_id", "work_id", "provider_delivery_id") if getattr(request, n)]
    if len(given) != 1:
        raise invalid_argument(
            "give exactly one of receipt_id, work_id, provider_delivery_id", Reason.FILTER_REQUIRED
        )
    if request.receipt_id < 0 or request.work_id < 0:
        raise invalid_argument(f"{given[0]} must be a positive id", field=given[0])
    if request.namespace and not request.provider_delivery_id:
        raise invalid_argument("namespace narrows provider_delivery_id only", field="namespace")
    if request.include_payload and (principal is None or not principal.may_see_payload):
        raise permission_denied(
            Reason.PAYLOAD_NOT_ALLOWED,
            "include_payload needs role ReplayConnectorEvents or ConnectorOperator",
            role="ReplayConnectorEvents",
        )


async def _receipt_id(conn: Any, request: pb.TraceDeliveryRequest) -> int:
    if request.receipt_id:
        return int(request.receipt_id)
    if request.work_id:
        rid = await work_items.admin.work_item_receipt_id(conn, request.work_id)
        if rid is None:
            raise not_found(Reason.WORK_ITEM_NOT_FOUND, f"work item {request.work_id} not found")
        return rid
    flt = DeliveryFilter(
        provider_delivery_id=request.provider_delivery_id, namespace=request.namespace or None
    )
    ids = await receipts.find.receipt_find(conn, flt, after=None, limit=10)
    if not ids:
        raise not_found(Reason.DELIVERY_NOT_FOUND, "no receipt has this provider delivery id")
    if len(ids) > 1:
        raise invalid_argument(
            f"{len(ids)} receipts have this provider delivery id; give namespace or receipt_id",
            Reason.AMBIGUOUS_DELIVERY,
            receipt_ids=",".join(str(i) for i in ids),
        )
    return ids[0]


def work_attempts(w: dict[str, Any], kept: list[dict[str, Any]]) -> tuple[list[pb.WorkAttempt], int]:
    """A WorkItem's attempts, oldest first, and how many of its claims are too old to be kept
    (``WorkItemTrace.attempts``). ``kept``: its ``connector_work_attempt`` rows in token order. The
    ring keeps the slots of the last ``ATTEMPTS_KEPT`` claims; a slot a later success did not overwrite
    may hold an older claim's attempt, which is left out so that "not kept" is exact. The current claim
    is read from the WorkItem row when nothing ended it with a row: running, or succeeded."""
    token = int(w["w_lease_token"] or 0)
    claims = token & ((1 << TOKEN_COUNTER_BITS) - 1)
    first_kept = claims - ATTEMPTS_KEPT
    out = [
        pb.WorkAttempt(
            attempt=int(a["attempt"]),
            lease_token=int(a["lease_token"]),
            lease_owner=a.get("lease_owner") or "",
            start_time=convert.ts(a.get("started_at")),
            end_time=convert.ts(a["ended_at"]),
            duration=convert.duration(a["ended_at"] - a["started_at"]) if a.get("started_at") else None,
            outcome=str(a["outcome"]),
            failure_class=a.get("failure_class") or "",
            failure_summary=a.get("failure_summary") or "",
        )
        for a in kept
        if int(a["lease_token"]) & ((1 << TOKEN_COUNTER_BITS) - 1) > first_kept
    ]
    state = str(w["w_state"])
    ended = any(int(a["lease_token"]) == token for a in kept)
    if claims and not ended and state in ("processing", "succeeded") and w.get("w_started_at"):
        start, end = w["w_started_at"], w.get("w_finished_at") if state == "succeeded" else None
        out.append(
            pb.WorkAttempt(
                attempt=int(w["w_attempts"]),
                lease_token=token,
                lease_owner=w.get("w_lease_owner") or "",
                start_time=convert.ts(start),
                end_time=convert.ts(end),
                duration=convert.duration(end - start) if end is not None else None,
                outcome="running" if state == "processing" else "succeeded",
            )
        )
    return out, max(0, first_kept)


async def trace_delivery(
    pool: Any, request: pb.TraceDeliveryRequest, principal: Principal | None, *, stale_s: float
) -> pb.TraceDeliveryResponse:
    check_request(request, principal)
    with_body = request.include_payload
    async with connection(pool) as conn, conn.transaction():
        await snapshot_read_only(conn)
        receipt_id = await _receipt_id(conn, request)
        row = await receipts.find.receipt_trace_get(conn, receipt_id, with_body=with_body)
        if row is None:
            raise not_found(Reason.RECEIPT_NOT_FOUND, f"receipt {receipt_id} not found")
        event_rows = await events.event_list_by_receipts(conn, [receipt_id])
        item_rows = await work_items.admin.work_item_list_by_events(
            conn, [int(e["e_event_id"]) for e in event_rows]
        )
        members: list[LaneMember] = []
        for w in item_rows:
            for lane in lanes_of(
                int(w["w_installed_pack_id"]), w["w_source_lane_key"], w["w_target_mutation_lane_key"]
            ):
                members.append(LaneMember(lane, int(w["w_delivery_seq"]), int(w["w_work_id"])))
        positions = await lane_position_batch(conn, members)
        authorities = await authority.claim_authority_list(
            conn, [(int(w["w_installed_pack_id"]), int(w["w_generation"])) for w in item_rows]
        )
        attempt_rows: dict[int, list[dict[str, Any]]] = {}
        for a in await work_items.admin.work_attempt_list(conn, [int(w["w_work_id"]) for w in item_rows]):
            attempt_rows.setdefault(int(a["work_id"]), []).append(a)
        claimants = await processes.process_count_work_item_fresh(conn, stale_s=stale_s)
        pause_rows: dict[tuple[int, str], dict[str, Any]] = {}
        if any(a.get("paused_queue_classes") for a in authorities.values()):
            # Who paused and why: one read of the pause rows (operator actions: a small table).
            for p in await pause_store.pause_list(conn):
                pause_rows[(int(p["installed_pack_id"]), str(p["queue_class"]))] = p
        circuit_rows: dict[tuple[int, str], dict[str, Any]] = {}
        for pack, key in sorted(
            {
                (int(w["w_installed_pack_id"]), str(w["w_circuit_key"]))
                for w in item_rows
                if w.get("w_circuit_key")
            }
        ):
            c = await circuit_store.circuit_get(conn, pack, key)  # a delivery fans out to a few
            if c is not None:
                circuit_rows[(pack, key)] = c
    now: datetime = row["db_now"]
    body = bytes(row["r_body"]) if with_body and row.get("r_body") is not None else None
    scheme, key_ref = verification_parts(row.get("r_verification"))
    response = pb.TraceDeliveryResponse(
        receipt=convert.receipt(row, body),
        routing=pb.ReceiptRouting(
            verification_scheme=scheme,
            verification_key_ref=key_ref,
            next_attempt_time=convert.ts(row["r_next_attempt_at"])
            if row["r_router_status"] in ("pending", "retry")
            else None,
            route_time=convert.ts(row.get("r_routed_at")),
            claim_owner=row.get("r_claim_owner") or "" if row["r_router_status"] == "routing" else "",
            lease_until=convert.ts(row.get("r_lease_until")),
            detail=routing_detail(row, now),
        ),
        observe_time=convert.ts(now),
        active_claimants=claimants,
        traceparent=row.get("r_traceparent") or "",
        trace_id=trace_id_of(row.get("r_traceparent")),
    )
    by_event: dict[int, pb.EventTrace] = {}
    for e in event_rows:
        trace = pb.EventTrace(
            event=convert.event(e),
            execution_owner=e.get("e_execution_owner") or "",
            legacy_state=e.get("e_legacy_state") or "",
        )
        by_event[int(e["e_event_id"])] = trace
    for w in item_rows:
        work_id = int(w["w_work_id"])
        lanes: list[LaneView] = []
        for of in lanes_of(
            int(w["w_installed_pack_id"]), w["w_source_lane_key"], w["w_target_mutation_lane_key"]
        ):
            pos = positions.get((of, work_id))
            if pos is not None:
                lanes.append(_lane_view(pos))
        wait = why_not_running(
            w,
            lanes,
            authorities.get((int(w["w_installed_pack_id"]), int(w["w_generation"]))),
            claimants,
            now,
            pause_rows,
            circuit_rows,
        )

        attempts, not_kept = work_attempts(w, attempt_rows.get(work_id, []))
        by_event[int(w["w_event_id"])].work_items.append(
            pb.WorkItemTrace(
                attempts=attempts,
                claims_not_kept=not_kept,
                claim_path=owner_path(
                    w["w_state"], authorities.get((int(w["w_installed_pack_id"]), int(w["w_generation"])))
                ),
                work_item=convert.work_item(w),
                lanes=[_lane_pb(x) for x in lanes],
                wait=pb.WorkItemWait(
                    reason=wait.reason,  # type: ignore[arg-type]
                    detail=wait.detail,
                    until=convert.ts(wait.until),
                    blocking_work_id=wait.blocking_work_id,
                    lease_owner=wait.lease_owner,
                ),
            )
        )
    response.events.extend(by_event.values())
    return response
