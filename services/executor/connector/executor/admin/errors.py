"""Admin API errors: canonical gRPC codes with a machine-readable ``ErrorInfo`` reason (AIP-193).

Every reason the admin API can answer is named here, so docs/admin.md, the CLI and the tests share
one vocabulary. Messages are shown to callers: they never carry payloads, tokens or secrets.
"""

from __future__ import annotations

from enum import StrEnum

import grpc

from connector.common.core import grpc_input, grpc_server
from connector.common.core.grpc_server import ServiceError


class Reason(StrEnum):
    # UNAUTHENTICATED
    TOKEN_MISSING = "TOKEN_MISSING"  # noqa: S105 - a reason code, not a secret
    TOKEN_INVALID = "TOKEN_INVALID"  # noqa: S105 - a reason code, not a secret
    # PERMISSION_DENIED
    ROLE_REQUIRED = "ROLE_REQUIRED"
    PAYLOAD_NOT_ALLOWED = "PAYLOAD_NOT_ALLOWED"
    # INVALID_ARGUMENT
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    INVALID_PAGE_TOKEN = "INVALID_PAGE_TOKEN"  # noqa: S105 - a reason code, not a secret
    PAGE_TOKEN_FILTER_MISMATCH = "PAGE_TOKEN_FILTER_MISMATCH"  # noqa: S105 - a reason code, not a secret
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
    INVALID_MANIFEST = "INVALID_MANIFEST"
    # FindDeliveries / TraceDelivery (docs/admin.md, "Find" and "Trace")
    FILTER_REQUIRED = "FILTER_REQUIRED"
    INVALID_TIME_RANGE = "INVALID_TIME_RANGE"
    UNKNOWN_STATE = "UNKNOWN_STATE"
    AMBIGUOUS_DELIVERY = "AMBIGUOUS_DELIVERY"
    # INVALID_ARGUMENT, from the server's input stage (connector.common.core.grpc_input), before any
    # handler runs; metadata ``field`` names the field (never its value)
    MALFORMED_REQUEST = grpc_input.MALFORMED_REQUEST
    INVALID_STRING = grpc_input.INVALID_STRING
    STRING_TOO_LONG = grpc_input.STRING_TOO_LONG
    INVALID_TIMESTAMP = grpc_input.INVALID_TIMESTAMP
    # NOT_FOUND
    WORK_ITEM_NOT_FOUND = "WORK_ITEM_NOT_FOUND"
    RECEIPT_NOT_FOUND = "RECEIPT_NOT_FOUND"
    DELIVERY_NOT_FOUND = "DELIVERY_NOT_FOUND"
    PACK_NOT_FOUND = "PACK_NOT_FOUND"
    CIRCUIT_NOT_FOUND = "CIRCUIT_NOT_FOUND"
    GENERATION_NOT_FOUND = "GENERATION_NOT_FOUND"
    ROUTE_NOT_FOUND = "ROUTE_NOT_FOUND"
    # FAILED_PRECONDITION: replay refusals (fail closed)
    NOT_DEAD = "NOT_DEAD"
    LEGACY_RECONCILED = "LEGACY_RECONCILED"
    LEGACY_OUTCOME_PENDING = "LEGACY_OUTCOME_PENDING"
    LEGACY_OWNED = "LEGACY_OWNED"
    NO_ACTIVE_GENERATION = "NO_ACTIVE_GENERATION"
    INCARNATION_CHANGED = "INCARNATION_CHANGED"
    GENERATION_NOT_WORK_ITEM_OWNED = "GENERATION_NOT_WORK_ITEM_OWNED"
    ROUTE_GONE = "ROUTE_GONE"
    WORK_TYPE_GONE = "WORK_TYPE_GONE"
    PAYLOAD_MISSING = "PAYLOAD_MISSING"
    COMPANION_INCOMPLETE = "COMPANION_INCOMPLETE"
    IDENTITY_CHANGED = "IDENTITY_CHANGED"
    NOT_FAILED = "NOT_FAILED"
    ALREADY_MATERIALIZED = "ALREADY_MATERIALIZED"
    # FAILED_PRECONDITION: RunReconcile on a route that declares no reconcile
    NOT_RECONCILED = "NOT_RECONCILED"
    # FAILED_PRECONDITION: cancel refusals (admin/actions.py)
    WORK_ITEM_IN_FLIGHT = "WORK_ITEM_IN_FLIGHT"
    ALREADY_FINAL = "ALREADY_FINAL"
    # INVALID_ARGUMENT: pause of a queue class no generation of the pack declares
    QUEUE_CLASS_UNKNOWN = "QUEUE_CLASS_UNKNOWN"
    # FAILED_PRECONDITION: packs
    PACK_PRECONDITION = "PACK_PRECONDITION"
    # FAILED_PRECONDITION / NOT_FOUND: cutover and rollback gates (docs/cutover.md)
    CUTOVER_BLOCKED = "CUTOVER_BLOCKED"
    ROLLBACK_BLOCKED = "ROLLBACK_BLOCKED"
    CUTOVER_WRONG_PHASE = "CUTOVER_WRONG_PHASE"
    EVENT_NOT_FOUND = "EVENT_NOT_FOUND"
    LEGACY_NOT_OWNED = "LEGACY_NOT_OWNED"
    LEGACY_OUTCOME_IN_FLIGHT = "LEGACY_OUTCOME_IN_FLIGHT"
    LEGACY_OUTCOME_NOT_UNKNOWN = "LEGACY_OUTCOME_NOT_UNKNOWN"
    # ABORTED
    CONCURRENT_CHANGE = "CONCURRENT_CHANGE"
    # RESOURCE_EXHAUSTED
    DATABASE_BUSY = grpc_server.DATABASE_BUSY
    BULK_REPLAY_LIMIT = "BULK_REPLAY_LIMIT"
    # DEADLINE_EXCEEDED
    STATEMENT_TIMEOUT = "STATEMENT_TIMEOUT"
    # UNAVAILABLE: the database connection was lost under the call, or the server refuses
    # connections now (restart, failover); retry with backoff (a mutation with the same
    # request_id, which answers the first outcome if its commit did land)
    DATABASE_UNAVAILABLE = grpc_server.DATABASE_UNAVAILABLE


def invalid_argument(message: str, reason: Reason = Reason.INVALID_ARGUMENT, **md: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, reason, message, md or None)


def not_found(reason: Reason, message: str, **md: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, reason, message, md or None)


def failed_precondition(reason: Reason, message: str, **md: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, reason, message, md or None)


def aborted(message: str, **md: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.ABORTED, Reason.CONCURRENT_CHANGE, message, md or None)


def permission_denied(reason: Reason, message: str, **md: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.PERMISSION_DENIED, reason, message, md or None)


def unauthenticated(reason: Reason, message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.UNAUTHENTICATED, reason, message)


def resource_exhausted(reason: Reason, message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, reason, message)


#: Human explanations of replay refusals (shown with the reason).
REFUSAL_MESSAGES: dict[Reason, str] = {
    Reason.NOT_DEAD: "only dead or cancelled work items can be replayed",
    Reason.LEGACY_RECONCILED: "the item executed under legacy ownership (reconciled_legacy_terminal); "
    "it is immutable and never reopened",
    Reason.LEGACY_OUTCOME_PENDING: "the item is rollback-fenced awaiting its legacy outcome",
    Reason.LEGACY_OWNED: "the event is owned by the legacy Event claim path",
    Reason.NO_ACTIVE_GENERATION: "the pack has no active generation",
    Reason.INCARNATION_CHANGED: "the pack was reinstalled since the event was materialized",
    Reason.GENERATION_NOT_WORK_ITEM_OWNED: "the active generation is not WorkItem-owned "
    "(claim path work_item, phase work_item_active, cutover receipt bound)",
    Reason.ROUTE_GONE: "the event's route does not exist in the active generation",
    Reason.WORK_TYPE_GONE: "the work type is no longer in the route's fan-out in the active generation",
    Reason.PAYLOAD_MISSING: "the receipt body is gone (neither body nor body_ref)",
    Reason.COMPANION_INCOMPLETE: "the event's companion snapshot lacks fields the current route requires",
    Reason.IDENTITY_CHANGED: "the current route's identity template does not yield the event's replay"
    " identity (idempotency key)",
    Reason.CONCURRENT_CHANGE: "the item changed concurrently (another replay or transition won)",
}
