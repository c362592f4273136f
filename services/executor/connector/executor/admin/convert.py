"""Rows to protos. The rows come from the store's aliased select lists, whose names these read:
``w_*`` from ``store.work_items.admin.WORK_ITEM_SELECT_COLUMNS``, ``e_*`` from
``store.events.EVENT_SELECT_COLUMNS``, ``r_*`` from ``store.receipts.admin.RECEIPT_SELECT_COLUMNS``.

Sanitized by construction: the receipt select list never includes the signature, the verification
secret reference or the body; the body is added only when a caller allowed to see payloads asks.
Free-text summaries are capped in length.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from connector.v1 import admin_service_pb2, types_pb2

SUMMARY_MAX = 1000


def ts(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(value)
    return out


def duration(value: timedelta | None) -> duration_pb2.Duration | None:
    if value is None:
        return None
    out = duration_pb2.Duration()
    out.FromTimedelta(max(value, timedelta(0)))
    return out


def _text(value: Any, limit: int | None = None) -> str:
    if value is None:
        return ""
    text = str(value)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def summary(value: Any) -> str:
    """A free-text summary as the API shows it (capped at ``SUMMARY_MAX`` characters)."""
    return _text(value, SUMMARY_MAX) or "-"


def _hex(value: Any) -> str:
    return bytes(value).hex() if value is not None else ""


def _ids(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): _text(v, 200) for k, v in value.items() if v is not None}


def work_item_state(state: str) -> int:
    return int(types_pb2.WorkItemState.Value(f"WORK_ITEM_STATE_{state.upper()}"))


def receipt_status(status: str) -> int:
    return int(types_pb2.ReceiptStatus.Value(f"RECEIPT_STATUS_{status.upper()}"))


def claim_path(path: str | None) -> int:
    if not path:
        return int(types_pb2.CLAIM_PATH_UNSPECIFIED)
    return int(types_pb2.ClaimPath.Value(f"CLAIM_PATH_{path.upper()}"))


def cutover_phase(phase: str | None) -> int:
    if not phase:
        return int(types_pb2.CUTOVER_PHASE_UNSPECIFIED)
    return int(types_pb2.CutoverPhase.Value(f"CUTOVER_PHASE_{phase.upper()}"))


def cutover_receipt(row: dict[str, Any]) -> admin_service_pb2.CutoverReceipt:
    """A ``store.authority`` cutover receipt row (``cutover_receipt_get`` / ``cutover_receipt_list``)."""
    return admin_service_pb2.CutoverReceipt(
        cutover_receipt_id=row["cutover_receipt_id"],
        kind=row["kind"],
        claim_path=claim_path(row["claim_path"]),  # type: ignore[arg-type]
        proof_sha256=row["proof_sha256"],
        actor=row["actor"],
        create_time=ts(row["created_at"]),
    )


def work_item(row: dict[str, Any], prefix: str = "w_") -> types_pb2.WorkItem:
    def g(name: str) -> Any:
        return row.get(prefix + name)

    return types_pb2.WorkItem(
        work_id=g("work_id"),
        event_id=g("event_id"),
        installed_pack_id=g("installed_pack_id"),
        generation=g("generation"),
        work_type=_text(g("work_type")),
        queue_class=_text(g("queue_class")),
        state=work_item_state(g("state")),  # type: ignore[arg-type]
        run_after=ts(g("run_after")),
        priority=g("priority") or 0,
        attempts=g("attempts") or 0,
        max_attempts=g("max_attempts") or 0,
        delivery_seq=g("delivery_seq") or 0,
        source_lane_key=_text(g("source_lane_key")),
        target_mutation_lane_key=_text(g("target_mutation_lane_key")),
        lease_owner=_text(g("lease_owner")),
        lease_token=g("lease_token") or 0,
        lease_until=ts(g("lease_until")),
        outcome=_text(g("outcome"), SUMMARY_MAX),
        failure_class=_text(g("failure_class"), 200),
        failure_summary=_text(g("failure_summary"), SUMMARY_MAX),
        replay_count=g("replay_count") or 0,
        create_time=ts(g("created_at")),
        update_time=ts(g("updated_at")),
        finish_time=ts(g("finished_at")),
        debounce_key=_text(g("debounce_key")),
        covered_by=g("covered_by") or 0,
    )


def event(row: dict[str, Any]) -> types_pb2.Event | None:
    if row.get("e_event_id") is None:
        return None
    return types_pb2.Event(
        event_id=row["e_event_id"],
        receipt_id=row["e_receipt_id"],
        installed_pack_id=row["e_installed_pack_id"],
        generation=row["e_generation"],
        incarnation=row["e_incarnation"],
        route_id=row["e_route_id"],
        route_version=row["e_route_version"],
        namespace=_text(row["e_namespace"]),
        event_kind=_text(row["e_event_kind"]),
        source_object_kind=_text(row["e_source_object_kind"]),
        source_object_id=_text(row["e_source_object_id"]),
        idempotency_key=_text(row["e_idempotency_key"]),
        delivery_seq=row["e_delivery_seq"],
        payload_sha256=_hex(row["e_payload_sha256"]),
        parse_outcome=_text(row["e_parse_outcome"], 200),
        correlation_ids=_ids(row["e_correlation_ids"]),
        create_time=ts(row["e_created_at"]),
    )


def receipt(row: dict[str, Any], body: bytes | None = None) -> types_pb2.Receipt | None:
    if row.get("r_receipt_id") is None:
        return None
    return types_pb2.Receipt(
        receipt_id=row["r_receipt_id"],
        namespace=_text(row["r_namespace"]),
        route_key=_text(row["r_route_key"]),
        provider_delivery_id=_text(row["r_provider_delivery_id"]),
        method=_text(row["r_method"]),
        content_type=_text(row["r_content_type"]),
        event_kind=_text(row["r_event_kind"]),
        received_time=ts(row["r_received_at"]),
        accept_time=ts(row["r_accepted_at"]),
        correlation_ids=_ids(row["r_correlation_ids"]),
        payload_sha256=_hex(row["r_payload_sha256"]),
        status=receipt_status(row["r_router_status"]),  # type: ignore[arg-type]
        attempts=row["r_attempts"],
        event_ids=list(row["r_enqueued_event_ids"] or ()),
        error_class=_text(row["r_error_class"], 200),
        error_summary=_text(row["r_error_summary"], SUMMARY_MAX),
        body=body or b"",
        origin=_text(row.get("r_origin")) or "webhook",
    )


def pause(row: dict[str, Any] | None, pack_name: str) -> admin_service_pb2.Pause:
    """A ``store.pauses`` row (``PAUSE_COLUMNS``) as a Pause; empty for ``None``."""
    if row is None:
        return admin_service_pb2.Pause()
    return admin_service_pb2.Pause(
        installed_pack_id=int(row["installed_pack_id"]),
        pack_name=pack_name,
        queue_class=str(row["queue_class"]),
        actor=_text(row["actor"]),
        reason=_text(row["reason"], SUMMARY_MAX),
        request_id=_text(row["request_id"]),
        pause_time=ts(row["paused_at"]),
    )


def rate_limit(row: dict[str, Any]) -> admin_service_pb2.RateLimitStats:
    """A ``store.flow.rate_limit_stats`` row as a RateLimitStats."""
    return admin_service_pb2.RateLimitStats(
        installed_pack_id=int(row["installed_pack_id"]),
        pack_name=_text(row["name"]),
        work_type=_text(row["work_type"]),
        key=_text(row["rate_key"]),
        limit=int(row["limit_n"]),
        period=duration(timedelta(seconds=float(row["period_s"]))),
        burst=int(row["burst"]),
        budget=round(float(row["budget"]), 3),
        next_claim_in=duration(timedelta(seconds=float(row["next_in_s"]))),
        waiting=int(row["waiting"]),
        in_flight=int(row["in_flight"]),
    )


def debounce(row: dict[str, Any]) -> admin_service_pb2.DebounceStats:
    """A ``store.debounce.debounce_stats`` row as a DebounceStats."""
    msg = admin_service_pb2.DebounceStats(
        installed_pack_id=int(row["installed_pack_id"]),
        pack_name=_text(row["name"]),
        work_type=_text(row["work_type"]),
        key=_text(row["debounce_key"]),
        waiting=int(row["waiting"]),
        parked=int(row["parked"]),
        last_executed_work_id=int(row["last_claimed_id"]),
    )
    msg.window.FromTimedelta(timedelta(seconds=float(row["window_s"])))
    msg.max_wait.FromTimedelta(timedelta(seconds=float(row["max_wait_s"])))
    if row["next_due_s"] is not None:
        msg.next_due_in.FromTimedelta(timedelta(seconds=float(row["next_due_s"])))
    return msg


_CIRCUIT_STATES = {
    "closed": admin_service_pb2.CIRCUIT_STATE_CLOSED,
    "open": admin_service_pb2.CIRCUIT_STATE_OPEN,
    "half_open": admin_service_pb2.CIRCUIT_STATE_HALF_OPEN,
}


def circuit(row: dict[str, Any], pack_name: str | None = None) -> admin_service_pb2.Circuit:
    """A ``store.circuits`` row (``CIRCUIT_COLUMNS``, plus the stats' counts when present)."""
    return admin_service_pb2.Circuit(
        installed_pack_id=int(row["installed_pack_id"]),
        pack_name=_text(pack_name if pack_name is not None else row.get("pack_name")),
        target=_text(row["circuit_key"]),
        work_type=_text(row["work_type"]),
        state=_CIRCUIT_STATES.get(str(row["effective_state"]), admin_service_pb2.CIRCUIT_STATE_UNSPECIFIED),
        forced=bool(row["forced"]),
        open_until=ts(row["open_until"]),
        reason=_text(row["reason"]),
        change_time=ts(row["changed_at"]),
        opened_count=int(row["opened_count"]),
        consecutive_failures=int(row["consecutive"]),
        window_outcomes=int(row["window_outcomes"]),
        window_failures=int(row["window_failures"]),
        probes_in_flight=int(row["probes_in_flight"]),
        policy=admin_service_pb2.CircuitPolicy(
            consecutive_failures=int(row["consecutive_failures"]),
            failure_ratio=float(row["failure_ratio"] or 0.0),
            window=duration(timedelta(seconds=float(row["window_s"]))),
            min_outcomes=int(row["min_outcomes"]),
            open=duration(timedelta(seconds=float(row["open_s"]))),
            half_open_probes=int(row["half_open_probes"]),
        ),
        waiting=int(row.get("waiting") or 0),
        in_flight=int(row.get("in_flight") or 0),
        actor=_text(row["actor"]),
        note=_text(row["note"], SUMMARY_MAX),
    )


def concurrency(row: dict[str, Any]) -> admin_service_pb2.ConcurrencyStats:
    """A ``store.flow.concurrency_stats`` row as a ConcurrencyStats."""
    return admin_service_pb2.ConcurrencyStats(
        installed_pack_id=int(row["installed_pack_id"]),
        pack_name=_text(row["name"]),
        work_type=_text(row["work_type"]),
        key=_text(row["concurrency_key"]),
        limit=int(row["max_in_flight"]),
        slots_taken=int(row["in_flight"]),
        waiting=int(row["waiting"]),
        parked=int(row["parked"]),
        in_flight=int(row["processing"]),
    )
