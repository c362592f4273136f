"""Operator actions on the queue: cancel a WorkItem, pause and resume a pack or queue class
(docs/admin.md "Cancel" and "Pause and resume").

**Cancel** (``CancelWorkItem``, role ReplayConnectorEvents — the inverse of a replay). Checked
before anything changes, each refusal with a reason: the item exists; it is ``pending``,
``blocked``, ``retry`` or ``dead`` (``processing``: WORK_ITEM_IN_FLIGHT — it is claimed, its
handler may be running, so it is not ours to stop; ``succeeded`` / ``cancelled``: ALREADY_FINAL;
``awaiting_legacy_outcome`` / ``reconciled_legacy_terminal``: the legacy path's); its event is
WorkItem-owned. The transition (``store.work_items.admin.work_item_cancel``) in the call's transaction:
lane locks → ``UPDATE`` fenced by the lease token the checks saw and a cancellable state → lane
settle (the next member of each lane becomes runnable, as for any terminal state) → NOTIFY. A claim
that took the row in between makes the fence match nothing: the call re-reads the row and answers
WORK_ITEM_IN_FLIGHT (claimed) or ABORTED (changed otherwise). Exactly one of a claim and a cancel
wins. The item keeps its attempts; ``failure_class`` becomes ``cancelled`` and
``failure_summary`` names the actor, the reason and the last failure.

**Pause / resume** (``PausePack`` / ``ResumePack``, role ConnectorOperator — they stop a whole
pack's processing, like the cutover gates). A ``connector_pause`` row (who, why, when, request
id), projected in the same transaction onto the pack's claim authority rows, which every claim
statement locks FOR SHARE (``store.pauses``). Idempotent: pausing what is paused keeps the first
pause and answers ``changed = false``; resuming what is not paused likewise.

All three take ``request_id`` (AIP-155, through the servicer's ``_mutate``) and ``dry_run`` (the
checks only, the answer a real call would give, nothing changed or remembered), and write one
structured INFO line each (``connector.common.core.eventlog``: event ``work_item_cancelled``,
``pack_paused``, ``pack_resumed``) after commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from psycopg import AsyncConnection

from connector.common.core.eventlog import events, safe_token
from connector.common.store import authority, circuits, pauses, work_items
from connector.common.store.lanes import lanes_of
from connector.common.store.vocabulary import PAUSE_WHOLE_PACK, WORK_CANCELLABLE
from connector.executor.admin.errors import (
    Reason,
    aborted,
    failed_precondition,
    invalid_argument,
    not_found,
)

Conn = AsyncConnection[Any]

#: Longest operator reason kept (on the row, the pause, the log line).
MAX_REASON = 500


def check_reason(reason: str) -> str:
    text = " ".join(reason.split())
    if not text:
        raise invalid_argument("reason is required (what and why, for the audit)", field="reason")
    return text[:MAX_REASON]


# ------------------------------------------------------------------------------------------------
# Cancel
# ------------------------------------------------------------------------------------------------


def _refuse_cancel(work_id: int, state: str) -> NoReturn:
    md = {"work_id": str(work_id), "state": state}
    if state == "processing":
        raise failed_precondition(
            Reason.WORK_ITEM_IN_FLIGHT,
            f"work item {work_id} is claimed (processing): its handler may be running; wait for its "
            "outcome (a retry can be cancelled then)",
            **md,
        )
    if state in ("succeeded", "cancelled"):
        raise failed_precondition(Reason.ALREADY_FINAL, f"work item {work_id} is already {state}", **md)
    if state == "awaiting_legacy_outcome":
        raise failed_precondition(
            Reason.LEGACY_OUTCOME_PENDING,
            f"work item {work_id} is rollback-fenced awaiting its legacy outcome",
            **md,
        )
    if state == "reconciled_legacy_terminal":
        raise failed_precondition(
            Reason.LEGACY_RECONCILED, f"work item {work_id} executed under legacy ownership (immutable)", **md
        )
    raise failed_precondition(
        Reason.ALREADY_FINAL, f"work item {work_id} is {state}", **md
    )  # pragma: no cover


@dataclass(frozen=True, slots=True)
class Cancelled:
    row: dict[str, Any]  # the item after (dry run: as it is)
    promoted: int


async def work_item_cancel(conn: Conn, work_id: int, *, actor: str, reason: str, dry_run: bool) -> Cancelled:
    """Cancel one item inside the caller's transaction (see the module docstring)."""
    item = await work_items.admin.work_item_cancel_candidate(conn, work_id)
    if item is None:
        raise not_found(Reason.WORK_ITEM_NOT_FOUND, f"work item {work_id} not found")
    state = str(item["state"])
    if state not in WORK_CANCELLABLE:
        _refuse_cancel(work_id, state)
    if item["execution_owner"] != "work_item":
        raise failed_precondition(
            Reason.LEGACY_OWNED, f"the event of work item {work_id} is owned by the legacy Event claim path"
        )
    if dry_run:
        return Cancelled((await work_items.admin.work_item_get_many(conn, [work_id]))[work_id], 0)
    last = (
        f"; last failure: {item['failure_class']}: {item['failure_summary']}" if item["failure_class"] else ""
    )
    summary = f"cancelled by {actor}: {reason}{last}"
    lanes = lanes_of(
        int(item["installed_pack_id"]), item["source_lane_key"], item["target_mutation_lane_key"]
    )
    debounce = (
        (int(item["installed_pack_id"]), str(item["work_type"]), str(item["debounce_key"]))
        if item.get("debounce_key") is not None
        else None
    )
    done, promoted = await work_items.admin.work_item_cancel(
        conn, work_id, int(item["lease_token"]), lanes, summary=summary, debounce=debounce
    )
    row = (await work_items.admin.work_item_get_many(conn, [work_id]))[work_id]
    if not done:
        now = str(row["w_state"])
        if now == "processing":
            raise failed_precondition(
                Reason.WORK_ITEM_IN_FLIGHT,
                f"work item {work_id} was claimed concurrently (processing); nothing was cancelled",
                work_id=str(work_id),
                state=now,
            )
        raise aborted(
            f"work item {work_id} changed concurrently (now {now}); read it again", work_id=str(work_id)
        )
    return Cancelled(row, promoted)


def log_cancelled(c: Cancelled, *, actor: str, reason: str, request_id: str) -> None:
    """The audit line, after commit."""
    row = c.row
    events("executor").emit(
        "work_item_cancelled",
        "operator",
        "work item cancelled",
        work_id=int(row["w_work_id"]),
        event_id=int(row["w_event_id"]),
        installed_pack_id=int(row["w_installed_pack_id"]),
        work_type=row["w_work_type"],
        actor=actor,
        note=reason,
        request_id=safe_token(request_id),
        lane_members_promoted=c.promoted,
    )


# ------------------------------------------------------------------------------------------------
# Pause / resume
# ------------------------------------------------------------------------------------------------


async def _scope(conn: Conn, pack: int, queue_class: str) -> tuple[str, str]:
    """``(pack name, stored queue class)``; NOT_FOUND / INVALID_ARGUMENT. The pack row is locked for
    the transaction: a pack apply (which copies the pauses onto a new generation's authority row)
    and another pause of the pack serialize with this one."""
    found = await authority.pack_lock(conn, {"pack": pack})
    if found is None:
        raise not_found(Reason.PACK_NOT_FOUND, f"pack {pack} not found")
    if not queue_class:
        return str(found["name"]), PAUSE_WHOLE_PACK
    if queue_class == PAUSE_WHOLE_PACK:
        return str(found["name"]), PAUSE_WHOLE_PACK
    if queue_class not in await pauses.pack_queue_classes(conn, pack):
        raise invalid_argument(
            f"no generation of pack {pack} declares queue class {queue_class!r}",
            Reason.QUEUE_CLASS_UNKNOWN,
            field="queue_class",
        )
    return str(found["name"]), queue_class


@dataclass(frozen=True, slots=True)
class PauseResult:
    pause: dict[str, Any] | None
    pack_name: str
    changed: bool


async def pack_pause(
    conn: Conn, pack: int, queue_class: str, *, actor: str, reason: str, request_id: str, dry_run: bool
) -> PauseResult:
    name, qc = await _scope(conn, pack, queue_class)
    existing = await pauses.pause_get(conn, pack, qc)
    if existing is not None:
        return PauseResult(existing, name, False)
    if dry_run:
        preview = {
            "installed_pack_id": pack,
            "queue_class": qc,
            "actor": actor,
            "reason": reason,
            "request_id": request_id or None,
            "paused_at": None,
        }
        return PauseResult(preview, name, True)
    row = await pauses.pause_insert(conn, pack, qc, actor=actor, reason=reason, request_id=request_id or None)
    assert row is not None  # the pack row is locked: no concurrent pause of it
    return PauseResult(row, name, True)


async def pack_resume(conn: Conn, pack: int, queue_class: str, *, dry_run: bool) -> PauseResult:
    name, qc = await _scope(conn, pack, queue_class)
    if dry_run:
        existing = await pauses.pause_get(conn, pack, qc)
        return PauseResult(existing, name, existing is not None)
    row = await pauses.pause_delete(conn, pack, qc)
    return PauseResult(row, name, row is not None)


def log_pause(event: str, r: PauseResult, *, actor: str, request_id: str, reason: str | None) -> None:
    assert r.pause is not None
    events("executor").emit(
        event,
        "operator",
        "pack paused" if event == "pack_paused" else "pack resumed",
        installed_pack_id=int(r.pause["installed_pack_id"]),
        pack=r.pack_name,
        queue_class=r.pause["queue_class"],
        actor=actor,
        note=reason,
        request_id=safe_token(request_id),
    )


# ------------------------------------------------------------------------------------------------
# Circuit breakers: manual open / close (docs/adr/013-circuit-breakers.md)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CircuitResult:
    row: dict[str, Any]  # the circuit after (dry run or unchanged: as it is)
    pack_name: str
    changed: bool
    #: Closing: the items it held that are due now (``work_items.admin.work_item_circuit_release``).
    released: int = 0


async def circuit_set(
    conn: Conn, pack: int, target: str, *, open_: bool, actor: str, reason: str, dry_run: bool
) -> CircuitResult:
    """Force a circuit open (until closed here) or close it, in the caller's transaction. Idempotent:
    opening a forced-open circuit or closing a closed one changes nothing (``changed = false``).
    The change takes the circuit row ``FOR UPDATE``: it waits for the claims in flight, and no claim
    committing after it admits an item of the target (``store.circuits``)."""
    found = await authority.pack_lock(conn, {"pack": pack})
    if found is None:
        raise not_found(Reason.PACK_NOT_FOUND, f"pack {pack} not found")
    row = await circuits.circuit_get(conn, pack, target)
    if row is None:
        raise not_found(
            Reason.CIRCUIT_NOT_FOUND,
            f"pack {pack} has no circuit breaker on target {target!r} (GetQueueStats lists them)",
        )
    name = str(found["name"])
    already = bool(row["forced"]) if open_ else (row["state"] == circuits.CLOSED and not row["forced"])
    if already or dry_run:
        return CircuitResult(row, name, not already)
    after = await circuits.circuit_set(conn, pack, target, open_=open_, actor=actor, note=reason)
    assert after is not None  # the row exists (circuits are never deleted)
    # Closed: what it held back (deferred to the end of its open period) is due at once.
    released = 0 if open_ else await work_items.admin.work_item_circuit_release(conn, pack, target)
    return CircuitResult(after, name, True, released)


def log_circuit(r: CircuitResult, *, actor: str, reason: str, request_id: str) -> None:
    """The audit line, after commit."""
    opened = r.row["state"] == circuits.OPEN
    events("executor").emit(
        "circuit_opened" if opened else "circuit_closed",
        "operator",
        "circuit breaker opened by an operator" if opened else "circuit breaker closed by an operator",
        installed_pack_id=int(r.row["installed_pack_id"]),
        pack=r.pack_name,
        target=r.row["circuit_key"],
        actor=actor,
        note=reason,
        request_id=safe_token(request_id),
        **({} if opened else {"items_due_now": r.released}),
    )
