import datetime

from connector.v1 import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QueueStatsView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUEUE_STATS_VIEW_UNSPECIFIED: _ClassVar[QueueStatsView]
    QUEUE_STATS_VIEW_FULL: _ClassVar[QueueStatsView]
    QUEUE_STATS_VIEW_KEYS: _ClassVar[QueueStatsView]

class FiguresWindow(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FIGURES_WINDOW_UNSPECIFIED: _ClassVar[FiguresWindow]
    FIGURES_WINDOW_HOUR: _ClassVar[FiguresWindow]
    FIGURES_WINDOW_DAY: _ClassVar[FiguresWindow]

class CircuitState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CIRCUIT_STATE_UNSPECIFIED: _ClassVar[CircuitState]
    CIRCUIT_STATE_CLOSED: _ClassVar[CircuitState]
    CIRCUIT_STATE_OPEN: _ClassVar[CircuitState]
    CIRCUIT_STATE_HALF_OPEN: _ClassVar[CircuitState]

class LaneKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LANE_KIND_UNSPECIFIED: _ClassVar[LaneKind]
    LANE_KIND_SOURCE: _ClassVar[LaneKind]
    LANE_KIND_TARGET_MUTATION: _ClassVar[LaneKind]

class LegacyOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LEGACY_OUTCOME_UNSPECIFIED: _ClassVar[LegacyOutcome]
    LEGACY_OUTCOME_SUCCEEDED: _ClassVar[LegacyOutcome]
    LEGACY_OUTCOME_FAILED: _ClassVar[LegacyOutcome]
    LEGACY_OUTCOME_UNKNOWN: _ClassVar[LegacyOutcome]

class WaitReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_REASON_UNSPECIFIED: _ClassVar[WaitReason]
    WAIT_REASON_RUNNING: _ClassVar[WaitReason]
    WAIT_REASON_LEASE_EXPIRED: _ClassVar[WaitReason]
    WAIT_REASON_DUE: _ClassVar[WaitReason]
    WAIT_REASON_BACKOFF: _ClassVar[WaitReason]
    WAIT_REASON_LANE_BLOCKED: _ClassVar[WaitReason]
    WAIT_REASON_NO_CLAIMANT: _ClassVar[WaitReason]
    WAIT_REASON_CLAIM_PATH_CLOSED: _ClassVar[WaitReason]
    WAIT_REASON_DEAD: _ClassVar[WaitReason]
    WAIT_REASON_SUCCEEDED: _ClassVar[WaitReason]
    WAIT_REASON_AWAITING_LEGACY_OUTCOME: _ClassVar[WaitReason]
    WAIT_REASON_LEGACY_TERMINAL: _ClassVar[WaitReason]
    WAIT_REASON_PAUSED: _ClassVar[WaitReason]
    WAIT_REASON_CANCELLED: _ClassVar[WaitReason]
    WAIT_REASON_SCHEDULED: _ClassVar[WaitReason]
    WAIT_REASON_RATE_LIMITED: _ClassVar[WaitReason]
    WAIT_REASON_CONCURRENCY_LIMITED: _ClassVar[WaitReason]
    WAIT_REASON_DEBOUNCED: _ClassVar[WaitReason]
    WAIT_REASON_COALESCED: _ClassVar[WaitReason]
    WAIT_REASON_CIRCUIT_OPEN: _ClassVar[WaitReason]

class ReconcileRunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECONCILE_RUN_STATE_UNSPECIFIED: _ClassVar[ReconcileRunState]
    RECONCILE_RUN_STATE_PENDING: _ClassVar[ReconcileRunState]
    RECONCILE_RUN_STATE_RUNNING: _ClassVar[ReconcileRunState]
    RECONCILE_RUN_STATE_DONE: _ClassVar[ReconcileRunState]
    RECONCILE_RUN_STATE_FAILED: _ClassVar[ReconcileRunState]
QUEUE_STATS_VIEW_UNSPECIFIED: QueueStatsView
QUEUE_STATS_VIEW_FULL: QueueStatsView
QUEUE_STATS_VIEW_KEYS: QueueStatsView
FIGURES_WINDOW_UNSPECIFIED: FiguresWindow
FIGURES_WINDOW_HOUR: FiguresWindow
FIGURES_WINDOW_DAY: FiguresWindow
CIRCUIT_STATE_UNSPECIFIED: CircuitState
CIRCUIT_STATE_CLOSED: CircuitState
CIRCUIT_STATE_OPEN: CircuitState
CIRCUIT_STATE_HALF_OPEN: CircuitState
LANE_KIND_UNSPECIFIED: LaneKind
LANE_KIND_SOURCE: LaneKind
LANE_KIND_TARGET_MUTATION: LaneKind
LEGACY_OUTCOME_UNSPECIFIED: LegacyOutcome
LEGACY_OUTCOME_SUCCEEDED: LegacyOutcome
LEGACY_OUTCOME_FAILED: LegacyOutcome
LEGACY_OUTCOME_UNKNOWN: LegacyOutcome
WAIT_REASON_UNSPECIFIED: WaitReason
WAIT_REASON_RUNNING: WaitReason
WAIT_REASON_LEASE_EXPIRED: WaitReason
WAIT_REASON_DUE: WaitReason
WAIT_REASON_BACKOFF: WaitReason
WAIT_REASON_LANE_BLOCKED: WaitReason
WAIT_REASON_NO_CLAIMANT: WaitReason
WAIT_REASON_CLAIM_PATH_CLOSED: WaitReason
WAIT_REASON_DEAD: WaitReason
WAIT_REASON_SUCCEEDED: WaitReason
WAIT_REASON_AWAITING_LEGACY_OUTCOME: WaitReason
WAIT_REASON_LEGACY_TERMINAL: WaitReason
WAIT_REASON_PAUSED: WaitReason
WAIT_REASON_CANCELLED: WaitReason
WAIT_REASON_SCHEDULED: WaitReason
WAIT_REASON_RATE_LIMITED: WaitReason
WAIT_REASON_CONCURRENCY_LIMITED: WaitReason
WAIT_REASON_DEBOUNCED: WaitReason
WAIT_REASON_COALESCED: WaitReason
WAIT_REASON_CIRCUIT_OPEN: WaitReason
RECONCILE_RUN_STATE_UNSPECIFIED: ReconcileRunState
RECONCILE_RUN_STATE_PENDING: ReconcileRunState
RECONCILE_RUN_STATE_RUNNING: ReconcileRunState
RECONCILE_RUN_STATE_DONE: ReconcileRunState
RECONCILE_RUN_STATE_FAILED: ReconcileRunState

class DeadLetter(_message.Message):
    __slots__ = ("work_item", "event", "receipt", "claim_path", "legacy_failure")
    WORK_ITEM_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    CLAIM_PATH_FIELD_NUMBER: _ClassVar[int]
    LEGACY_FAILURE_FIELD_NUMBER: _ClassVar[int]
    work_item: _types_pb2.WorkItem
    event: _types_pb2.Event
    receipt: _types_pb2.Receipt
    claim_path: str
    legacy_failure: LegacyFailure
    def __init__(self, work_item: _Optional[_Union[_types_pb2.WorkItem, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.Event, _Mapping]] = ..., receipt: _Optional[_Union[_types_pb2.Receipt, _Mapping]] = ..., claim_path: _Optional[str] = ..., legacy_failure: _Optional[_Union[LegacyFailure, _Mapping]] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "installed_pack_id", "generation", "work_type", "failure_class", "finish_time_after", "finish_time_before", "failure_summary")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_AFTER_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_BEFORE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    installed_pack_id: int
    generation: int
    work_type: str
    failure_class: str
    finish_time_after: _timestamp_pb2.Timestamp
    finish_time_before: _timestamp_pb2.Timestamp
    failure_summary: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., work_type: _Optional[str] = ..., failure_class: _Optional[str] = ..., finish_time_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., failure_summary: _Optional[str] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters", "next_page_token")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    next_page_token: str
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetWorkItemRequest(_message.Message):
    __slots__ = ("work_id", "include_payload")
    WORK_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    work_id: int
    include_payload: bool
    def __init__(self, work_id: _Optional[int] = ..., include_payload: _Optional[bool] = ...) -> None: ...

class GetWorkItemResponse(_message.Message):
    __slots__ = ("work_item", "event", "receipt")
    WORK_ITEM_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    work_item: _types_pb2.WorkItem
    event: _types_pb2.Event
    receipt: _types_pb2.Receipt
    def __init__(self, work_item: _Optional[_Union[_types_pb2.WorkItem, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.Event, _Mapping]] = ..., receipt: _Optional[_Union[_types_pb2.Receipt, _Mapping]] = ...) -> None: ...

class ReplayWorkItemRequest(_message.Message):
    __slots__ = ("work_id", "request_id", "dry_run")
    WORK_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    work_id: int
    request_id: str
    dry_run: bool
    def __init__(self, work_id: _Optional[int] = ..., request_id: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ReplayWorkItemResponse(_message.Message):
    __slots__ = ("work_item", "dry_run")
    WORK_ITEM_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    work_item: _types_pb2.WorkItem
    dry_run: bool
    def __init__(self, work_item: _Optional[_Union[_types_pb2.WorkItem, _Mapping]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ReplayDeadLettersRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "work_type", "failure_class", "finish_time_after", "finish_time_before", "dry_run", "rate_limit", "request_id", "failure_summary", "work_ids")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_AFTER_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_BEFORE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    WORK_IDS_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    work_type: str
    failure_class: str
    finish_time_after: _timestamp_pb2.Timestamp
    finish_time_before: _timestamp_pb2.Timestamp
    dry_run: bool
    rate_limit: int
    request_id: str
    failure_summary: str
    work_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., work_type: _Optional[str] = ..., failure_class: _Optional[str] = ..., finish_time_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dry_run: _Optional[bool] = ..., rate_limit: _Optional[int] = ..., request_id: _Optional[str] = ..., failure_summary: _Optional[str] = ..., work_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ReplayDeadLettersResponse(_message.Message):
    __slots__ = ("total", "replayed", "refused", "refused_by_reason", "done", "eligible", "lanes", "lane_keys")
    class RefusedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    LANE_KEYS_FIELD_NUMBER: _ClassVar[int]
    total: int
    replayed: int
    refused: int
    refused_by_reason: _containers.ScalarMap[str, int]
    done: bool
    eligible: int
    lanes: int
    lane_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, total: _Optional[int] = ..., replayed: _Optional[int] = ..., refused: _Optional[int] = ..., refused_by_reason: _Optional[_Mapping[str, int]] = ..., done: _Optional[bool] = ..., eligible: _Optional[int] = ..., lanes: _Optional[int] = ..., lane_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class CancelDeadLettersRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "work_type", "failure_class", "finish_time_after", "finish_time_before", "failure_summary", "work_ids", "reason", "dry_run", "rate_limit", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_AFTER_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_BEFORE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    WORK_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    work_type: str
    failure_class: str
    finish_time_after: _timestamp_pb2.Timestamp
    finish_time_before: _timestamp_pb2.Timestamp
    failure_summary: str
    work_ids: _containers.RepeatedScalarFieldContainer[int]
    reason: str
    dry_run: bool
    rate_limit: int
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., work_type: _Optional[str] = ..., failure_class: _Optional[str] = ..., finish_time_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., failure_summary: _Optional[str] = ..., work_ids: _Optional[_Iterable[int]] = ..., reason: _Optional[str] = ..., dry_run: _Optional[bool] = ..., rate_limit: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class CancelDeadLettersResponse(_message.Message):
    __slots__ = ("total", "cancelled", "refused", "refused_by_reason", "done", "eligible", "lanes", "lane_keys")
    class RefusedByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ELIGIBLE_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    LANE_KEYS_FIELD_NUMBER: _ClassVar[int]
    total: int
    cancelled: int
    refused: int
    refused_by_reason: _containers.ScalarMap[str, int]
    done: bool
    eligible: int
    lanes: int
    lane_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, total: _Optional[int] = ..., cancelled: _Optional[int] = ..., refused: _Optional[int] = ..., refused_by_reason: _Optional[_Mapping[str, int]] = ..., done: _Optional[bool] = ..., eligible: _Optional[int] = ..., lanes: _Optional[int] = ..., lane_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class ListReceiptFailuresRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "namespace")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    namespace: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class ListReceiptFailuresResponse(_message.Message):
    __slots__ = ("receipts", "next_page_token")
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    receipts: _containers.RepeatedCompositeFieldContainer[_types_pb2.Receipt]
    next_page_token: str
    def __init__(self, receipts: _Optional[_Iterable[_Union[_types_pb2.Receipt, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReplayReceiptRequest(_message.Message):
    __slots__ = ("receipt_id", "request_id")
    RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    receipt_id: int
    request_id: str
    def __init__(self, receipt_id: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReplayReceiptResponse(_message.Message):
    __slots__ = ("receipt",)
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    receipt: _types_pb2.Receipt
    def __init__(self, receipt: _Optional[_Union[_types_pb2.Receipt, _Mapping]] = ...) -> None: ...

class GetQueueStatsRequest(_message.Message):
    __slots__ = ("installed_pack_id", "view")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    view: QueueStatsView
    def __init__(self, installed_pack_id: _Optional[int] = ..., view: _Optional[_Union[QueueStatsView, str]] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("installed_pack_id", "pack_name", "queue_class", "depth_by_state", "oldest_ready_age", "in_flight", "retry_rate", "dead_rate", "due", "paused")
    class DepthByStateEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    PACK_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEPTH_BY_STATE_FIELD_NUMBER: _ClassVar[int]
    OLDEST_READY_AGE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    RETRY_RATE_FIELD_NUMBER: _ClassVar[int]
    DEAD_RATE_FIELD_NUMBER: _ClassVar[int]
    DUE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    pack_name: str
    queue_class: str
    depth_by_state: _containers.ScalarMap[str, int]
    oldest_ready_age: _duration_pb2.Duration
    in_flight: int
    retry_rate: float
    dead_rate: float
    due: int
    paused: bool
    def __init__(self, installed_pack_id: _Optional[int] = ..., pack_name: _Optional[str] = ..., queue_class: _Optional[str] = ..., depth_by_state: _Optional[_Mapping[str, int]] = ..., oldest_ready_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., in_flight: _Optional[int] = ..., retry_rate: _Optional[float] = ..., dead_rate: _Optional[float] = ..., due: _Optional[int] = ..., paused: _Optional[bool] = ...) -> None: ...

class GetQueueStatsResponse(_message.Message):
    __slots__ = ("queues", "receipts_unrouted", "oldest_unrouted_age", "active_claimants", "receipts_routing", "receipts_failed", "pauses", "rate_limits", "rate_limits_truncated", "concurrency", "concurrency_truncated", "debounce", "debounce_truncated", "circuits", "circuits_truncated")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_UNROUTED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNROUTED_AGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CLAIMANTS_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_ROUTING_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FAILED_FIELD_NUMBER: _ClassVar[int]
    PAUSES_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITS_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    CIRCUITS_FIELD_NUMBER: _ClassVar[int]
    CIRCUITS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    receipts_unrouted: int
    oldest_unrouted_age: _duration_pb2.Duration
    active_claimants: int
    receipts_routing: int
    receipts_failed: int
    pauses: _containers.RepeatedCompositeFieldContainer[Pause]
    rate_limits: _containers.RepeatedCompositeFieldContainer[RateLimitStats]
    rate_limits_truncated: bool
    concurrency: _containers.RepeatedCompositeFieldContainer[ConcurrencyStats]
    concurrency_truncated: bool
    debounce: _containers.RepeatedCompositeFieldContainer[DebounceStats]
    debounce_truncated: bool
    circuits: _containers.RepeatedCompositeFieldContainer[Circuit]
    circuits_truncated: bool
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ..., receipts_unrouted: _Optional[int] = ..., oldest_unrouted_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., active_claimants: _Optional[int] = ..., receipts_routing: _Optional[int] = ..., receipts_failed: _Optional[int] = ..., pauses: _Optional[_Iterable[_Union[Pause, _Mapping]]] = ..., rate_limits: _Optional[_Iterable[_Union[RateLimitStats, _Mapping]]] = ..., rate_limits_truncated: _Optional[bool] = ..., concurrency: _Optional[_Iterable[_Union[ConcurrencyStats, _Mapping]]] = ..., concurrency_truncated: _Optional[bool] = ..., debounce: _Optional[_Iterable[_Union[DebounceStats, _Mapping]]] = ..., debounce_truncated: _Optional[bool] = ..., circuits: _Optional[_Iterable[_Union[Circuit, _Mapping]]] = ..., circuits_truncated: _Optional[bool] = ...) -> None: ...

class GetFiguresRequest(_message.Message):
    __slots__ = ("window", "installed_pack_ids", "current_only", "packs_only")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_PACK_IDS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ONLY_FIELD_NUMBER: _ClassVar[int]
    PACKS_ONLY_FIELD_NUMBER: _ClassVar[int]
    window: FiguresWindow
    installed_pack_ids: _containers.RepeatedScalarFieldContainer[int]
    current_only: bool
    packs_only: bool
    def __init__(self, window: _Optional[_Union[FiguresWindow, str]] = ..., installed_pack_ids: _Optional[_Iterable[int]] = ..., current_only: _Optional[bool] = ..., packs_only: _Optional[bool] = ...) -> None: ...

class LatencyQuantiles(_message.Message):
    __slots__ = ("p50", "p95", "p99", "count")
    P50_FIELD_NUMBER: _ClassVar[int]
    P95_FIELD_NUMBER: _ClassVar[int]
    P99_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    p50: _duration_pb2.Duration
    p95: _duration_pb2.Duration
    p99: _duration_pb2.Duration
    count: int
    def __init__(self, p50: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., p95: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., p99: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., count: _Optional[int] = ...) -> None: ...

class FiguresGauges(_message.Message):
    __slots__ = ("backlog", "in_flight", "oldest_ready_age", "open_circuits", "pauses", "active_executors", "ingress_processes", "receipts_unrouted", "oldest_unrouted_age")
    BACKLOG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_READY_AGE_FIELD_NUMBER: _ClassVar[int]
    OPEN_CIRCUITS_FIELD_NUMBER: _ClassVar[int]
    PAUSES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_EXECUTORS_FIELD_NUMBER: _ClassVar[int]
    INGRESS_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_UNROUTED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNROUTED_AGE_FIELD_NUMBER: _ClassVar[int]
    backlog: int
    in_flight: int
    oldest_ready_age: _duration_pb2.Duration
    open_circuits: int
    pauses: int
    active_executors: int
    ingress_processes: int
    receipts_unrouted: int
    oldest_unrouted_age: _duration_pb2.Duration
    def __init__(self, backlog: _Optional[int] = ..., in_flight: _Optional[int] = ..., oldest_ready_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., open_circuits: _Optional[int] = ..., pauses: _Optional[int] = ..., active_executors: _Optional[int] = ..., ingress_processes: _Optional[int] = ..., receipts_unrouted: _Optional[int] = ..., oldest_unrouted_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class FiguresPoint(_message.Message):
    __slots__ = ("start_time", "seconds", "accepted", "duplicates", "rejected", "unavailable", "executed", "succeeded", "failed", "dead_lettered", "ack_latency", "delivery_latency", "scheduling_delay", "gauges")
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    EXECUTED_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    ACK_LATENCY_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_LATENCY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULING_DELAY_FIELD_NUMBER: _ClassVar[int]
    GAUGES_FIELD_NUMBER: _ClassVar[int]
    start_time: _timestamp_pb2.Timestamp
    seconds: float
    accepted: int
    duplicates: int
    rejected: int
    unavailable: int
    executed: int
    succeeded: int
    failed: int
    dead_lettered: int
    ack_latency: LatencyQuantiles
    delivery_latency: LatencyQuantiles
    scheduling_delay: LatencyQuantiles
    gauges: FiguresGauges
    def __init__(self, start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., seconds: _Optional[float] = ..., accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., rejected: _Optional[int] = ..., unavailable: _Optional[int] = ..., executed: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., ack_latency: _Optional[_Union[LatencyQuantiles, _Mapping]] = ..., delivery_latency: _Optional[_Union[LatencyQuantiles, _Mapping]] = ..., scheduling_delay: _Optional[_Union[LatencyQuantiles, _Mapping]] = ..., gauges: _Optional[_Union[FiguresGauges, _Mapping]] = ...) -> None: ...

class FiguresSeries(_message.Message):
    __slots__ = ("installed_pack_id", "pack_name", "points", "current")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    PACK_NAME_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    pack_name: str
    points: _containers.RepeatedCompositeFieldContainer[FiguresPoint]
    current: FiguresPoint
    def __init__(self, installed_pack_id: _Optional[int] = ..., pack_name: _Optional[str] = ..., points: _Optional[_Iterable[_Union[FiguresPoint, _Mapping]]] = ..., current: _Optional[_Union[FiguresPoint, _Mapping]] = ...) -> None: ...

class GetFiguresResponse(_message.Message):
    __slots__ = ("window", "step", "end_time", "series")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    window: FiguresWindow
    step: _duration_pb2.Duration
    end_time: _timestamp_pb2.Timestamp
    series: _containers.RepeatedCompositeFieldContainer[FiguresSeries]
    def __init__(self, window: _Optional[_Union[FiguresWindow, str]] = ..., step: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., series: _Optional[_Iterable[_Union[FiguresSeries, _Mapping]]] = ...) -> None: ...

class DebounceStats(_message.Message):
    __slots__ = ("installed_pack_id", "pack_name", "work_type", "key", "window", "max_wait", "waiting", "parked", "next_due_in", "last_executed_work_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    PACK_NAME_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    NEXT_DUE_IN_FIELD_NUMBER: _ClassVar[int]
    LAST_EXECUTED_WORK_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    pack_name: str
    work_type: str
    key: str
    window: _duration_pb2.Duration
    max_wait: _duration_pb2.Duration
    waiting: int
    parked: int
    next_due_in: _duration_pb2.Duration
    last_executed_work_id: int
    def __init__(self, installed_pack_id: _Optional[int] = ..., pack_name: _Optional[str] = ..., work_type: _Optional[str] = ..., key: _Optional[str] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., waiting: _Optional[int] = ..., parked: _Optional[int] = ..., next_due_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., last_executed_work_id: _Optional[int] = ...) -> None: ...

class CircuitPolicy(_message.Message):
    __slots__ = ("consecutive_failures", "failure_ratio", "window", "min_outcomes", "open", "half_open_probes")
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    FAILURE_RATIO_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    MIN_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    HALF_OPEN_PROBES_FIELD_NUMBER: _ClassVar[int]
    consecutive_failures: int
    failure_ratio: float
    window: _duration_pb2.Duration
    min_outcomes: int
    open: _duration_pb2.Duration
    half_open_probes: int
    def __init__(self, consecutive_failures: _Optional[int] = ..., failure_ratio: _Optional[float] = ..., window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., min_outcomes: _Optional[int] = ..., open: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., half_open_probes: _Optional[int] = ...) -> None: ...

class Circuit(_message.Message):
    __slots__ = ("installed_pack_id", "pack_name", "target", "work_type", "state", "forced", "open_until", "reason", "change_time", "opened_count", "consecutive_failures", "window_outcomes", "window_failures", "probes_in_flight", "policy", "waiting", "in_flight", "actor", "note")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    PACK_NAME_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    FORCED_FIELD_NUMBER: _ClassVar[int]
    OPEN_UNTIL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHANGE_TIME_FIELD_NUMBER: _ClassVar[int]
    OPENED_COUNT_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FAILURES_FIELD_NUMBER: _ClassVar[int]
    PROBES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    pack_name: str
    target: str
    work_type: str
    state: CircuitState
    forced: bool
    open_until: _timestamp_pb2.Timestamp
    reason: str
    change_time: _timestamp_pb2.Timestamp
    opened_count: int
    consecutive_failures: int
    window_outcomes: int
    window_failures: int
    probes_in_flight: int
    policy: CircuitPolicy
    waiting: int
    in_flight: int
    actor: str
    note: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., pack_name: _Optional[str] = ..., target: _Optional[str] = ..., work_type: _Optional[str] = ..., state: _Optional[_Union[CircuitState, str]] = ..., forced: _Optional[bool] = ..., open_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., change_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., opened_count: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., window_outcomes: _Optional[int] = ..., window_failures: _Optional[int] = ..., probes_in_flight: _Optional[int] = ..., policy: _Optional[_Union[CircuitPolicy, _Mapping]] = ..., waiting: _Optional[int] = ..., in_flight: _Optional[int] = ..., actor: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class OpenCircuitRequest(_message.Message):
    __slots__ = ("installed_pack_id", "target", "reason", "dry_run", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    target: str
    reason: str
    dry_run: bool
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., target: _Optional[str] = ..., reason: _Optional[str] = ..., dry_run: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class OpenCircuitResponse(_message.Message):
    __slots__ = ("circuit", "changed", "dry_run")
    CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    circuit: Circuit
    changed: bool
    dry_run: bool
    def __init__(self, circuit: _Optional[_Union[Circuit, _Mapping]] = ..., changed: _Optional[bool] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CloseCircuitRequest(_message.Message):
    __slots__ = ("installed_pack_id", "target", "reason", "dry_run", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    target: str
    reason: str
    dry_run: bool
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., target: _Optional[str] = ..., reason: _Optional[str] = ..., dry_run: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class CloseCircuitResponse(_message.Message):
    __slots__ = ("circuit", "changed", "dry_run")
    CIRCUIT_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    circuit: Circuit
    changed: bool
    dry_run: bool
    def __init__(self, circuit: _Optional[_Union[Circuit, _Mapping]] = ..., changed: _Optional[bool] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ConcurrencyStats(_message.Message):
    __slots__ = ("installed_pack_id", "pack_name", "work_type", "key", "limit", "slots_taken", "waiting", "parked", "in_flight")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    PACK_NAME_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SLOTS_TAKEN_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    PARKED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    pack_name: str
    work_type: str
    key: str
    limit: int
    slots_taken: int
    waiting: int
    parked: int
    in_flight: int
    def __init__(self, installed_pack_id: _Optional[int] = ..., pack_name: _Optional[str] = ..., work_type: _Optional[str] = ..., key: _Optional[str] = ..., limit: _Optional[int] = ..., slots_taken: _Optional[int] = ..., waiting: _Optional[int] = ..., parked: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class RateLimitStats(_message.Message):
    __slots__ = ("installed_pack_id", "pack_name", "work_type", "key", "limit", "period", "burst", "budget", "next_claim_in", "waiting", "in_flight")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    PACK_NAME_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    NEXT_CLAIM_IN_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    pack_name: str
    work_type: str
    key: str
    limit: int
    period: _duration_pb2.Duration
    burst: int
    budget: float
    next_claim_in: _duration_pb2.Duration
    waiting: int
    in_flight: int
    def __init__(self, installed_pack_id: _Optional[int] = ..., pack_name: _Optional[str] = ..., work_type: _Optional[str] = ..., key: _Optional[str] = ..., limit: _Optional[int] = ..., period: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., burst: _Optional[int] = ..., budget: _Optional[float] = ..., next_claim_in: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., waiting: _Optional[int] = ..., in_flight: _Optional[int] = ...) -> None: ...

class BlockedLane(_message.Message):
    __slots__ = ("installed_pack_id", "kind", "lane_key", "head", "waiting")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    LANE_KEY_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    kind: LaneKind
    lane_key: str
    head: _types_pb2.WorkItem
    waiting: int
    def __init__(self, installed_pack_id: _Optional[int] = ..., kind: _Optional[_Union[LaneKind, str]] = ..., lane_key: _Optional[str] = ..., head: _Optional[_Union[_types_pb2.WorkItem, _Mapping]] = ..., waiting: _Optional[int] = ...) -> None: ...

class ListBlockedLanesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "installed_pack_id")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    installed_pack_id: int
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., installed_pack_id: _Optional[int] = ...) -> None: ...

class ListBlockedLanesResponse(_message.Message):
    __slots__ = ("lanes", "next_page_token")
    LANES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    lanes: _containers.RepeatedCompositeFieldContainer[BlockedLane]
    next_page_token: str
    def __init__(self, lanes: _Optional[_Iterable[_Union[BlockedLane, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PackGeneration(_message.Message):
    __slots__ = ("generation", "status", "manifest_sha256", "create_time", "activate_time", "route_count")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ACTIVATE_TIME_FIELD_NUMBER: _ClassVar[int]
    ROUTE_COUNT_FIELD_NUMBER: _ClassVar[int]
    generation: int
    status: str
    manifest_sha256: str
    create_time: _timestamp_pb2.Timestamp
    activate_time: _timestamp_pb2.Timestamp
    route_count: int
    def __init__(self, generation: _Optional[int] = ..., status: _Optional[str] = ..., manifest_sha256: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., activate_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., route_count: _Optional[int] = ...) -> None: ...

class Pack(_message.Message):
    __slots__ = ("installed_pack_id", "name", "namespace", "incarnation", "active_generation", "generations")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    name: str
    namespace: str
    incarnation: int
    active_generation: int
    generations: _containers.RepeatedCompositeFieldContainer[PackGeneration]
    def __init__(self, installed_pack_id: _Optional[int] = ..., name: _Optional[str] = ..., namespace: _Optional[str] = ..., incarnation: _Optional[int] = ..., active_generation: _Optional[int] = ..., generations: _Optional[_Iterable[_Union[PackGeneration, _Mapping]]] = ...) -> None: ...

class ApplyPackRequest(_message.Message):
    __slots__ = ("manifest", "activate", "validate_only", "request_id")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    ACTIVATE_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    manifest: str
    activate: bool
    validate_only: bool
    request_id: str
    def __init__(self, manifest: _Optional[str] = ..., activate: _Optional[bool] = ..., validate_only: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class ApplyPackResponse(_message.Message):
    __slots__ = ("pack", "generation", "errors")
    PACK_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    pack: Pack
    generation: int
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pack: _Optional[_Union[Pack, _Mapping]] = ..., generation: _Optional[int] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...

class ListPacksRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPacksResponse(_message.Message):
    __slots__ = ("packs", "next_page_token")
    PACKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    packs: _containers.RepeatedCompositeFieldContainer[Pack]
    next_page_token: str
    def __init__(self, packs: _Optional[_Iterable[_Union[Pack, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ActivateGenerationRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ActivateGenerationResponse(_message.Message):
    __slots__ = ("pack",)
    PACK_FIELD_NUMBER: _ClassVar[int]
    pack: Pack
    def __init__(self, pack: _Optional[_Union[Pack, _Mapping]] = ...) -> None: ...

class CutoverReceipt(_message.Message):
    __slots__ = ("cutover_receipt_id", "kind", "claim_path", "proof_sha256", "actor", "create_time")
    CUTOVER_RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CLAIM_PATH_FIELD_NUMBER: _ClassVar[int]
    PROOF_SHA256_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    cutover_receipt_id: int
    kind: str
    claim_path: _types_pb2.ClaimPath
    proof_sha256: str
    actor: str
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, cutover_receipt_id: _Optional[int] = ..., kind: _Optional[str] = ..., claim_path: _Optional[_Union[_types_pb2.ClaimPath, str]] = ..., proof_sha256: _Optional[str] = ..., actor: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GenerationCutoverState(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "claim_path", "phase", "receipts", "open_rollback_fences", "awaiting_legacy_outcome", "processing", "claim_capable_processes", "work_item_claim_processes", "legacy_event_claim_processes", "generation_status", "active", "legacy_pending", "legacy_in_flight", "awaiting_legacy_unknown", "unprojected_legacy_receipts", "authority_version", "rollback_fence_id", "admitting_receipt_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CLAIM_PATH_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    OPEN_ROLLBACK_FENCES_FIELD_NUMBER: _ClassVar[int]
    AWAITING_LEGACY_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_FIELD_NUMBER: _ClassVar[int]
    CLAIM_CAPABLE_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_CLAIM_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    LEGACY_EVENT_CLAIM_PROCESSES_FIELD_NUMBER: _ClassVar[int]
    GENERATION_STATUS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    LEGACY_PENDING_FIELD_NUMBER: _ClassVar[int]
    LEGACY_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    AWAITING_LEGACY_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    UNPROJECTED_LEGACY_RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    AUTHORITY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FENCE_ID_FIELD_NUMBER: _ClassVar[int]
    ADMITTING_RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    claim_path: _types_pb2.ClaimPath
    phase: _types_pb2.CutoverPhase
    receipts: _containers.RepeatedCompositeFieldContainer[CutoverReceipt]
    open_rollback_fences: int
    awaiting_legacy_outcome: int
    processing: int
    claim_capable_processes: int
    work_item_claim_processes: int
    legacy_event_claim_processes: int
    generation_status: str
    active: bool
    legacy_pending: int
    legacy_in_flight: int
    awaiting_legacy_unknown: int
    unprojected_legacy_receipts: int
    authority_version: int
    rollback_fence_id: int
    admitting_receipt_id: int
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., claim_path: _Optional[_Union[_types_pb2.ClaimPath, str]] = ..., phase: _Optional[_Union[_types_pb2.CutoverPhase, str]] = ..., receipts: _Optional[_Iterable[_Union[CutoverReceipt, _Mapping]]] = ..., open_rollback_fences: _Optional[int] = ..., awaiting_legacy_outcome: _Optional[int] = ..., processing: _Optional[int] = ..., claim_capable_processes: _Optional[int] = ..., work_item_claim_processes: _Optional[int] = ..., legacy_event_claim_processes: _Optional[int] = ..., generation_status: _Optional[str] = ..., active: _Optional[bool] = ..., legacy_pending: _Optional[int] = ..., legacy_in_flight: _Optional[int] = ..., awaiting_legacy_unknown: _Optional[int] = ..., unprojected_legacy_receipts: _Optional[int] = ..., authority_version: _Optional[int] = ..., rollback_fence_id: _Optional[int] = ..., admitting_receipt_id: _Optional[int] = ...) -> None: ...

class GetCutoverStateRequest(_message.Message):
    __slots__ = ("installed_pack_id",)
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    def __init__(self, installed_pack_id: _Optional[int] = ...) -> None: ...

class GetCutoverStateResponse(_message.Message):
    __slots__ = ("generations",)
    GENERATIONS_FIELD_NUMBER: _ClassVar[int]
    generations: _containers.RepeatedCompositeFieldContainer[GenerationCutoverState]
    def __init__(self, generations: _Optional[_Iterable[_Union[GenerationCutoverState, _Mapping]]] = ...) -> None: ...

class CutoverBlocker(_message.Message):
    __slots__ = ("code", "count", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    count: int
    message: str
    def __init__(self, code: _Optional[str] = ..., count: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class CutoverTransition(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "claim_path", "phase", "authority_version", "changed", "receipt", "rollback_fence_id", "fenced_work_items", "proof_json", "blockers", "dry_run")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CLAIM_PATH_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    AUTHORITY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_FENCE_ID_FIELD_NUMBER: _ClassVar[int]
    FENCED_WORK_ITEMS_FIELD_NUMBER: _ClassVar[int]
    PROOF_JSON_FIELD_NUMBER: _ClassVar[int]
    BLOCKERS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    claim_path: _types_pb2.ClaimPath
    phase: _types_pb2.CutoverPhase
    authority_version: int
    changed: bool
    receipt: CutoverReceipt
    rollback_fence_id: int
    fenced_work_items: int
    proof_json: str
    blockers: _containers.RepeatedCompositeFieldContainer[CutoverBlocker]
    dry_run: bool
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., claim_path: _Optional[_Union[_types_pb2.ClaimPath, str]] = ..., phase: _Optional[_Union[_types_pb2.CutoverPhase, str]] = ..., authority_version: _Optional[int] = ..., changed: _Optional[bool] = ..., receipt: _Optional[_Union[CutoverReceipt, _Mapping]] = ..., rollback_fence_id: _Optional[int] = ..., fenced_work_items: _Optional[int] = ..., proof_json: _Optional[str] = ..., blockers: _Optional[_Iterable[_Union[CutoverBlocker, _Mapping]]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class QuiesceLegacyRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class QuiesceLegacyResponse(_message.Message):
    __slots__ = ("transition",)
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    transition: CutoverTransition
    def __init__(self, transition: _Optional[_Union[CutoverTransition, _Mapping]] = ...) -> None: ...

class CompleteCutoverRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "dry_run", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    dry_run: bool
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., dry_run: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class CompleteCutoverResponse(_message.Message):
    __slots__ = ("transition",)
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    transition: CutoverTransition
    def __init__(self, transition: _Optional[_Union[CutoverTransition, _Mapping]] = ...) -> None: ...

class BeginRollbackRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class BeginRollbackResponse(_message.Message):
    __slots__ = ("transition",)
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    transition: CutoverTransition
    def __init__(self, transition: _Optional[_Union[CutoverTransition, _Mapping]] = ...) -> None: ...

class CompleteRollbackRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "dry_run", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    dry_run: bool
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., dry_run: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class CompleteRollbackResponse(_message.Message):
    __slots__ = ("transition",)
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    transition: CutoverTransition
    def __init__(self, transition: _Optional[_Union[CutoverTransition, _Mapping]] = ...) -> None: ...

class AbortTransitionRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class AbortTransitionResponse(_message.Message):
    __slots__ = ("transition",)
    TRANSITION_FIELD_NUMBER: _ClassVar[int]
    transition: CutoverTransition
    def __init__(self, transition: _Optional[_Union[CutoverTransition, _Mapping]] = ...) -> None: ...

class ReconcileLegacyOutcomesRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReconcileLegacyOutcomesResponse(_message.Message):
    __slots__ = ("projected", "duplicates", "conflicts", "conflict_receipt_ids", "resolved_fence_ids")
    PROJECTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_RECEIPT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FENCE_IDS_FIELD_NUMBER: _ClassVar[int]
    projected: int
    duplicates: int
    conflicts: int
    conflict_receipt_ids: _containers.RepeatedScalarFieldContainer[int]
    resolved_fence_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, projected: _Optional[int] = ..., duplicates: _Optional[int] = ..., conflicts: _Optional[int] = ..., conflict_receipt_ids: _Optional[_Iterable[int]] = ..., resolved_fence_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ResolveLegacyOutcomeRequest(_message.Message):
    __slots__ = ("event_id", "work_type", "outcome", "reason", "request_id")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    work_type: str
    outcome: LegacyOutcome
    reason: str
    request_id: str
    def __init__(self, event_id: _Optional[int] = ..., work_type: _Optional[str] = ..., outcome: _Optional[_Union[LegacyOutcome, str]] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResolveLegacyOutcomeResponse(_message.Message):
    __slots__ = ("event_id", "work_type", "version", "outcome", "digest", "event_legacy_state", "work_item_state")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    EVENT_LEGACY_STATE_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_STATE_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    work_type: str
    version: int
    outcome: LegacyOutcome
    digest: str
    event_legacy_state: str
    work_item_state: _types_pb2.WorkItemState
    def __init__(self, event_id: _Optional[int] = ..., work_type: _Optional[str] = ..., version: _Optional[int] = ..., outcome: _Optional[_Union[LegacyOutcome, str]] = ..., digest: _Optional[str] = ..., event_legacy_state: _Optional[str] = ..., work_item_state: _Optional[_Union[_types_pb2.WorkItemState, str]] = ...) -> None: ...

class LegacyFailure(_message.Message):
    __slots__ = ("event", "receipt", "work_type", "outcome", "version", "failure_class", "failure_summary", "actor", "create_time", "event_legacy_state", "work_id", "work_item_state")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    EVENT_LEGACY_STATE_FIELD_NUMBER: _ClassVar[int]
    WORK_ID_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_STATE_FIELD_NUMBER: _ClassVar[int]
    event: _types_pb2.Event
    receipt: _types_pb2.Receipt
    work_type: str
    outcome: LegacyOutcome
    version: int
    failure_class: str
    failure_summary: str
    actor: str
    create_time: _timestamp_pb2.Timestamp
    event_legacy_state: str
    work_id: int
    work_item_state: _types_pb2.WorkItemState
    def __init__(self, event: _Optional[_Union[_types_pb2.Event, _Mapping]] = ..., receipt: _Optional[_Union[_types_pb2.Receipt, _Mapping]] = ..., work_type: _Optional[str] = ..., outcome: _Optional[_Union[LegacyOutcome, str]] = ..., version: _Optional[int] = ..., failure_class: _Optional[str] = ..., failure_summary: _Optional[str] = ..., actor: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., event_legacy_state: _Optional[str] = ..., work_id: _Optional[int] = ..., work_item_state: _Optional[_Union[_types_pb2.WorkItemState, str]] = ...) -> None: ...

class ListLegacyFailuresRequest(_message.Message):
    __slots__ = ("installed_pack_id", "generation", "page_size", "page_token")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    generation: int
    page_size: int
    page_token: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLegacyFailuresResponse(_message.Message):
    __slots__ = ("failures", "next_page_token")
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    failures: _containers.RepeatedCompositeFieldContainer[LegacyFailure]
    next_page_token: str
    def __init__(self, failures: _Optional[_Iterable[_Union[LegacyFailure, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Process(_message.Message):
    __slots__ = ("process_id", "service", "hostname", "pid", "version", "claim_capability", "start_time", "heartbeat_time", "heartbeat_age", "stale", "revision")
    PROCESS_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CLAIM_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIME_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    process_id: str
    service: str
    hostname: str
    pid: int
    version: str
    claim_capability: str
    start_time: _timestamp_pb2.Timestamp
    heartbeat_time: _timestamp_pb2.Timestamp
    heartbeat_age: _duration_pb2.Duration
    stale: bool
    revision: str
    def __init__(self, process_id: _Optional[str] = ..., service: _Optional[str] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ..., claim_capability: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., heartbeat_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., heartbeat_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., stale: _Optional[bool] = ..., revision: _Optional[str] = ...) -> None: ...

class ListProcessesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "service")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    service: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., service: _Optional[str] = ...) -> None: ...

class ListProcessesResponse(_message.Message):
    __slots__ = ("processes", "next_page_token", "stale_after")
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STALE_AFTER_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[Process]
    next_page_token: str
    stale_after: _duration_pb2.Duration
    def __init__(self, processes: _Optional[_Iterable[_Union[Process, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., stale_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class CancelWorkItemRequest(_message.Message):
    __slots__ = ("work_id", "reason", "dry_run", "request_id")
    WORK_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    work_id: int
    reason: str
    dry_run: bool
    request_id: str
    def __init__(self, work_id: _Optional[int] = ..., reason: _Optional[str] = ..., dry_run: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class CancelWorkItemResponse(_message.Message):
    __slots__ = ("work_item", "dry_run", "lane_members_promoted")
    WORK_ITEM_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    LANE_MEMBERS_PROMOTED_FIELD_NUMBER: _ClassVar[int]
    work_item: _types_pb2.WorkItem
    dry_run: bool
    lane_members_promoted: int
    def __init__(self, work_item: _Optional[_Union[_types_pb2.WorkItem, _Mapping]] = ..., dry_run: _Optional[bool] = ..., lane_members_promoted: _Optional[int] = ...) -> None: ...

class Pause(_message.Message):
    __slots__ = ("installed_pack_id", "pack_name", "queue_class", "actor", "reason", "request_id", "pause_time")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    PACK_NAME_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CLASS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PAUSE_TIME_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    pack_name: str
    queue_class: str
    actor: str
    reason: str
    request_id: str
    pause_time: _timestamp_pb2.Timestamp
    def __init__(self, installed_pack_id: _Optional[int] = ..., pack_name: _Optional[str] = ..., queue_class: _Optional[str] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ..., request_id: _Optional[str] = ..., pause_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PausePackRequest(_message.Message):
    __slots__ = ("installed_pack_id", "queue_class", "reason", "dry_run", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CLASS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    queue_class: str
    reason: str
    dry_run: bool
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., queue_class: _Optional[str] = ..., reason: _Optional[str] = ..., dry_run: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class PausePackResponse(_message.Message):
    __slots__ = ("pause", "changed", "dry_run")
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    pause: Pause
    changed: bool
    dry_run: bool
    def __init__(self, pause: _Optional[_Union[Pause, _Mapping]] = ..., changed: _Optional[bool] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ResumePackRequest(_message.Message):
    __slots__ = ("installed_pack_id", "queue_class", "dry_run", "request_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CLASS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    queue_class: str
    dry_run: bool
    request_id: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., queue_class: _Optional[str] = ..., dry_run: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResumePackResponse(_message.Message):
    __slots__ = ("pause", "changed", "dry_run")
    PAUSE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    pause: Pause
    changed: bool
    dry_run: bool
    def __init__(self, pause: _Optional[_Union[Pause, _Mapping]] = ..., changed: _Optional[bool] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class FindDeliveriesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "receipt_id", "work_id", "provider_delivery_id", "idempotency_key", "correlation_name", "correlation_value", "namespace", "route_key", "event_kind", "receipt_status", "work_item_state", "accept_time_after", "accept_time_before", "origin")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    WORK_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_NAME_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_VALUE_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    EVENT_KIND_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_STATUS_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEM_STATE_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_TIME_AFTER_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_TIME_BEFORE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    receipt_id: int
    work_id: int
    provider_delivery_id: str
    idempotency_key: str
    correlation_name: str
    correlation_value: str
    namespace: str
    route_key: str
    event_kind: str
    receipt_status: str
    work_item_state: str
    accept_time_after: _timestamp_pb2.Timestamp
    accept_time_before: _timestamp_pb2.Timestamp
    origin: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., receipt_id: _Optional[int] = ..., work_id: _Optional[int] = ..., provider_delivery_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., correlation_name: _Optional[str] = ..., correlation_value: _Optional[str] = ..., namespace: _Optional[str] = ..., route_key: _Optional[str] = ..., event_kind: _Optional[str] = ..., receipt_status: _Optional[str] = ..., work_item_state: _Optional[str] = ..., accept_time_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., accept_time_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., origin: _Optional[str] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("receipt", "events", "work_items")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEMS_FIELD_NUMBER: _ClassVar[int]
    receipt: _types_pb2.Receipt
    events: _containers.RepeatedCompositeFieldContainer[_types_pb2.Event]
    work_items: _containers.RepeatedCompositeFieldContainer[_types_pb2.WorkItem]
    def __init__(self, receipt: _Optional[_Union[_types_pb2.Receipt, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_types_pb2.Event, _Mapping]]] = ..., work_items: _Optional[_Iterable[_Union[_types_pb2.WorkItem, _Mapping]]] = ...) -> None: ...

class FindDeliveriesResponse(_message.Message):
    __slots__ = ("deliveries", "next_page_token", "scanned_receipts")
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SCANNED_RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    next_page_token: str
    scanned_receipts: int
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., scanned_receipts: _Optional[int] = ...) -> None: ...

class TraceDeliveryRequest(_message.Message):
    __slots__ = ("receipt_id", "work_id", "provider_delivery_id", "namespace", "include_payload")
    RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    WORK_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    receipt_id: int
    work_id: int
    provider_delivery_id: str
    namespace: str
    include_payload: bool
    def __init__(self, receipt_id: _Optional[int] = ..., work_id: _Optional[int] = ..., provider_delivery_id: _Optional[str] = ..., namespace: _Optional[str] = ..., include_payload: _Optional[bool] = ...) -> None: ...

class ReceiptRouting(_message.Message):
    __slots__ = ("verification_scheme", "verification_key_ref", "next_attempt_time", "route_time", "claim_owner", "lease_until", "detail")
    VERIFICATION_SCHEME_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_KEY_REF_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_TIME_FIELD_NUMBER: _ClassVar[int]
    ROUTE_TIME_FIELD_NUMBER: _ClassVar[int]
    CLAIM_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    verification_scheme: str
    verification_key_ref: str
    next_attempt_time: _timestamp_pb2.Timestamp
    route_time: _timestamp_pb2.Timestamp
    claim_owner: str
    lease_until: _timestamp_pb2.Timestamp
    detail: str
    def __init__(self, verification_scheme: _Optional[str] = ..., verification_key_ref: _Optional[str] = ..., next_attempt_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., route_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., claim_owner: _Optional[str] = ..., lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., detail: _Optional[str] = ...) -> None: ...

class WorkItemWait(_message.Message):
    __slots__ = ("reason", "detail", "until", "blocking_work_id", "lease_owner")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    BLOCKING_WORK_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    reason: WaitReason
    detail: str
    until: _timestamp_pb2.Timestamp
    blocking_work_id: int
    lease_owner: str
    def __init__(self, reason: _Optional[_Union[WaitReason, str]] = ..., detail: _Optional[str] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., blocking_work_id: _Optional[int] = ..., lease_owner: _Optional[str] = ...) -> None: ...

class LanePosition(_message.Message):
    __slots__ = ("kind", "lane_key", "head_work_id", "head_state", "processing_work_id", "ahead")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LANE_KEY_FIELD_NUMBER: _ClassVar[int]
    HEAD_WORK_ID_FIELD_NUMBER: _ClassVar[int]
    HEAD_STATE_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_WORK_ID_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    kind: LaneKind
    lane_key: str
    head_work_id: int
    head_state: _types_pb2.WorkItemState
    processing_work_id: int
    ahead: int
    def __init__(self, kind: _Optional[_Union[LaneKind, str]] = ..., lane_key: _Optional[str] = ..., head_work_id: _Optional[int] = ..., head_state: _Optional[_Union[_types_pb2.WorkItemState, str]] = ..., processing_work_id: _Optional[int] = ..., ahead: _Optional[int] = ...) -> None: ...

class WorkItemTrace(_message.Message):
    __slots__ = ("work_item", "lanes", "wait", "claim_path", "attempts", "claims_not_kept")
    WORK_ITEM_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    CLAIM_PATH_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_NOT_KEPT_FIELD_NUMBER: _ClassVar[int]
    work_item: _types_pb2.WorkItem
    lanes: _containers.RepeatedCompositeFieldContainer[LanePosition]
    wait: WorkItemWait
    claim_path: str
    attempts: _containers.RepeatedCompositeFieldContainer[WorkAttempt]
    claims_not_kept: int
    def __init__(self, work_item: _Optional[_Union[_types_pb2.WorkItem, _Mapping]] = ..., lanes: _Optional[_Iterable[_Union[LanePosition, _Mapping]]] = ..., wait: _Optional[_Union[WorkItemWait, _Mapping]] = ..., claim_path: _Optional[str] = ..., attempts: _Optional[_Iterable[_Union[WorkAttempt, _Mapping]]] = ..., claims_not_kept: _Optional[int] = ...) -> None: ...

class WorkAttempt(_message.Message):
    __slots__ = ("attempt", "lease_token", "lease_owner", "start_time", "end_time", "duration", "outcome", "failure_class", "failure_summary")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    lease_token: int
    lease_owner: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    duration: _duration_pb2.Duration
    outcome: str
    failure_class: str
    failure_summary: str
    def __init__(self, attempt: _Optional[int] = ..., lease_token: _Optional[int] = ..., lease_owner: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., outcome: _Optional[str] = ..., failure_class: _Optional[str] = ..., failure_summary: _Optional[str] = ...) -> None: ...

class EventTrace(_message.Message):
    __slots__ = ("event", "execution_owner", "legacy_state", "work_items")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEGACY_STATE_FIELD_NUMBER: _ClassVar[int]
    WORK_ITEMS_FIELD_NUMBER: _ClassVar[int]
    event: _types_pb2.Event
    execution_owner: str
    legacy_state: str
    work_items: _containers.RepeatedCompositeFieldContainer[WorkItemTrace]
    def __init__(self, event: _Optional[_Union[_types_pb2.Event, _Mapping]] = ..., execution_owner: _Optional[str] = ..., legacy_state: _Optional[str] = ..., work_items: _Optional[_Iterable[_Union[WorkItemTrace, _Mapping]]] = ...) -> None: ...

class TraceDeliveryResponse(_message.Message):
    __slots__ = ("receipt", "routing", "events", "observe_time", "active_claimants", "traceparent", "trace_id")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    OBSERVE_TIME_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CLAIMANTS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    receipt: _types_pb2.Receipt
    routing: ReceiptRouting
    events: _containers.RepeatedCompositeFieldContainer[EventTrace]
    observe_time: _timestamp_pb2.Timestamp
    active_claimants: int
    traceparent: str
    trace_id: str
    def __init__(self, receipt: _Optional[_Union[_types_pb2.Receipt, _Mapping]] = ..., routing: _Optional[_Union[ReceiptRouting, _Mapping]] = ..., events: _Optional[_Iterable[_Union[EventTrace, _Mapping]]] = ..., observe_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., active_claimants: _Optional[int] = ..., traceparent: _Optional[str] = ..., trace_id: _Optional[str] = ...) -> None: ...

class RunReconcileRequest(_message.Message):
    __slots__ = ("namespace", "route_key", "since", "dry_run", "wait", "request_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    route_key: str
    since: _timestamp_pb2.Timestamp
    dry_run: bool
    wait: _duration_pb2.Duration
    request_id: str
    def __init__(self, namespace: _Optional[str] = ..., route_key: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., dry_run: _Optional[bool] = ..., wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReconcileRun(_message.Message):
    __slots__ = ("run_id", "namespace", "route_key", "state", "dry_run", "mode", "since", "until", "listed", "missing", "admitted", "redelivered", "pages", "error_class", "error", "missing_delivery_ids", "actor")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    LISTED_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MISSING_DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    run_id: int
    namespace: str
    route_key: str
    state: ReconcileRunState
    dry_run: bool
    mode: str
    since: _timestamp_pb2.Timestamp
    until: _timestamp_pb2.Timestamp
    listed: int
    missing: int
    admitted: int
    redelivered: int
    pages: int
    error_class: str
    error: str
    missing_delivery_ids: _containers.RepeatedScalarFieldContainer[str]
    actor: str
    def __init__(self, run_id: _Optional[int] = ..., namespace: _Optional[str] = ..., route_key: _Optional[str] = ..., state: _Optional[_Union[ReconcileRunState, str]] = ..., dry_run: _Optional[bool] = ..., mode: _Optional[str] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., listed: _Optional[int] = ..., missing: _Optional[int] = ..., admitted: _Optional[int] = ..., redelivered: _Optional[int] = ..., pages: _Optional[int] = ..., error_class: _Optional[str] = ..., error: _Optional[str] = ..., missing_delivery_ids: _Optional[_Iterable[str]] = ..., actor: _Optional[str] = ...) -> None: ...

class RunReconcileResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: ReconcileRun
    def __init__(self, run: _Optional[_Union[ReconcileRun, _Mapping]] = ...) -> None: ...

class ListReconcileStatesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "namespace")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    namespace: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., namespace: _Optional[str] = ...) -> None: ...

class ReconcileState(_message.Message):
    __slots__ = ("namespace", "route_key", "watermark", "last_pass_time", "last_clean_pass_time", "last_error_class", "last_error", "last_listed", "last_missing", "last_admitted", "pass_until", "create_time")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAST_PASS_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_CLEAN_PASS_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_LISTED_FIELD_NUMBER: _ClassVar[int]
    LAST_MISSING_FIELD_NUMBER: _ClassVar[int]
    LAST_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    PASS_UNTIL_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    route_key: str
    watermark: _timestamp_pb2.Timestamp
    last_pass_time: _timestamp_pb2.Timestamp
    last_clean_pass_time: _timestamp_pb2.Timestamp
    last_error_class: str
    last_error: str
    last_listed: int
    last_missing: int
    last_admitted: int
    pass_until: _timestamp_pb2.Timestamp
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., route_key: _Optional[str] = ..., watermark: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_pass_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_clean_pass_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_error_class: _Optional[str] = ..., last_error: _Optional[str] = ..., last_listed: _Optional[int] = ..., last_missing: _Optional[int] = ..., last_admitted: _Optional[int] = ..., pass_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListReconcileStatesResponse(_message.Message):
    __slots__ = ("states", "next_page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedCompositeFieldContainer[ReconcileState]
    next_page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[ReconcileState, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetCallerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetCallerResponse(_message.Message):
    __slots__ = ("key_id", "roles", "allowed_methods", "may_see_payload")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_METHODS_FIELD_NUMBER: _ClassVar[int]
    MAY_SEE_PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    allowed_methods: _containers.RepeatedScalarFieldContainer[str]
    may_see_payload: bool
    def __init__(self, key_id: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., allowed_methods: _Optional[_Iterable[str]] = ..., may_see_payload: _Optional[bool] = ...) -> None: ...

class ListFailureGroupsRequest(_message.Message):
    __slots__ = ("installed_pack_id", "scan_limit", "page_size", "page_token")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    SCAN_LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    scan_limit: int
    page_size: int
    page_token: str
    def __init__(self, installed_pack_id: _Optional[int] = ..., scan_limit: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class DeadLetterGroup(_message.Message):
    __slots__ = ("installed_pack_id", "pack_name", "work_type", "failure_class", "failure_summary", "count", "first_time", "last_time", "sample_work_id")
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    PACK_NAME_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_WORK_ID_FIELD_NUMBER: _ClassVar[int]
    installed_pack_id: int
    pack_name: str
    work_type: str
    failure_class: str
    failure_summary: str
    count: int
    first_time: _timestamp_pb2.Timestamp
    last_time: _timestamp_pb2.Timestamp
    sample_work_id: int
    def __init__(self, installed_pack_id: _Optional[int] = ..., pack_name: _Optional[str] = ..., work_type: _Optional[str] = ..., failure_class: _Optional[str] = ..., failure_summary: _Optional[str] = ..., count: _Optional[int] = ..., first_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., sample_work_id: _Optional[int] = ...) -> None: ...

class ReceiptFailureGroup(_message.Message):
    __slots__ = ("namespace", "route_key", "error_class", "error_summary", "count", "first_time", "last_time", "sample_receipt_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    ERROR_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_TIME_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    route_key: str
    error_class: str
    error_summary: str
    count: int
    first_time: _timestamp_pb2.Timestamp
    last_time: _timestamp_pb2.Timestamp
    sample_receipt_id: int
    def __init__(self, namespace: _Optional[str] = ..., route_key: _Optional[str] = ..., error_class: _Optional[str] = ..., error_summary: _Optional[str] = ..., count: _Optional[int] = ..., first_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., sample_receipt_id: _Optional[int] = ...) -> None: ...

class ListFailureGroupsResponse(_message.Message):
    __slots__ = ("dead_letters", "receipt_failures", "truncated", "next_page_token")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FAILURES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetterGroup]
    receipt_failures: _containers.RepeatedCompositeFieldContainer[ReceiptFailureGroup]
    truncated: bool
    next_page_token: str
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetterGroup, _Mapping]]] = ..., receipt_failures: _Optional[_Iterable[_Union[ReceiptFailureGroup, _Mapping]]] = ..., truncated: _Optional[bool] = ..., next_page_token: _Optional[str] = ...) -> None: ...
