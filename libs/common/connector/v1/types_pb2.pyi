import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkItemState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORK_ITEM_STATE_UNSPECIFIED: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_PENDING: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_BLOCKED: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_PROCESSING: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_RETRY: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_SUCCEEDED: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_DEAD: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_AWAITING_LEGACY_OUTCOME: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_RECONCILED_LEGACY_TERMINAL: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_CANCELLED: _ClassVar[WorkItemState]
    WORK_ITEM_STATE_COALESCED: _ClassVar[WorkItemState]

class ReceiptStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECEIPT_STATUS_UNSPECIFIED: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_PENDING: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_ROUTING: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_RETRY: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_MATERIALIZED: _ClassVar[ReceiptStatus]
    RECEIPT_STATUS_FAILED: _ClassVar[ReceiptStatus]

class ClaimPath(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLAIM_PATH_UNSPECIFIED: _ClassVar[ClaimPath]
    CLAIM_PATH_WORK_ITEM: _ClassVar[ClaimPath]
    CLAIM_PATH_LEGACY_EVENT: _ClassVar[ClaimPath]
    CLAIM_PATH_NONE: _ClassVar[ClaimPath]

class CutoverPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CUTOVER_PHASE_UNSPECIFIED: _ClassVar[CutoverPhase]
    CUTOVER_PHASE_LEGACY_ACTIVE: _ClassVar[CutoverPhase]
    CUTOVER_PHASE_QUIESCING: _ClassVar[CutoverPhase]
    CUTOVER_PHASE_WORK_ITEM_ACTIVE: _ClassVar[CutoverPhase]
    CUTOVER_PHASE_ROLLBACK_FENCED: _ClassVar[CutoverPhase]
WORK_ITEM_STATE_UNSPECIFIED: WorkItemState
WORK_ITEM_STATE_PENDING: WorkItemState
WORK_ITEM_STATE_BLOCKED: WorkItemState
WORK_ITEM_STATE_PROCESSING: WorkItemState
WORK_ITEM_STATE_RETRY: WorkItemState
WORK_ITEM_STATE_SUCCEEDED: WorkItemState
WORK_ITEM_STATE_DEAD: WorkItemState
WORK_ITEM_STATE_AWAITING_LEGACY_OUTCOME: WorkItemState
WORK_ITEM_STATE_RECONCILED_LEGACY_TERMINAL: WorkItemState
WORK_ITEM_STATE_CANCELLED: WorkItemState
WORK_ITEM_STATE_COALESCED: WorkItemState
RECEIPT_STATUS_UNSPECIFIED: ReceiptStatus
RECEIPT_STATUS_PENDING: ReceiptStatus
RECEIPT_STATUS_ROUTING: ReceiptStatus
RECEIPT_STATUS_RETRY: ReceiptStatus
RECEIPT_STATUS_MATERIALIZED: ReceiptStatus
RECEIPT_STATUS_FAILED: ReceiptStatus
CLAIM_PATH_UNSPECIFIED: ClaimPath
CLAIM_PATH_WORK_ITEM: ClaimPath
CLAIM_PATH_LEGACY_EVENT: ClaimPath
CLAIM_PATH_NONE: ClaimPath
CUTOVER_PHASE_UNSPECIFIED: CutoverPhase
CUTOVER_PHASE_LEGACY_ACTIVE: CutoverPhase
CUTOVER_PHASE_QUIESCING: CutoverPhase
CUTOVER_PHASE_WORK_ITEM_ACTIVE: CutoverPhase
CUTOVER_PHASE_ROLLBACK_FENCED: CutoverPhase

class Receipt(_message.Message):
    __slots__ = ("receipt_id", "namespace", "route_key", "provider_delivery_id", "method", "content_type", "event_kind", "received_time", "accept_time", "correlation_ids", "payload_sha256", "status", "attempts", "event_ids", "error_class", "error_summary", "body", "origin")
    class CorrelationIdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    EVENT_KIND_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_TIME_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_TIME_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_IDS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SHA256_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    ERROR_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    receipt_id: int
    namespace: str
    route_key: str
    provider_delivery_id: str
    method: str
    content_type: str
    event_kind: str
    received_time: _timestamp_pb2.Timestamp
    accept_time: _timestamp_pb2.Timestamp
    correlation_ids: _containers.ScalarMap[str, str]
    payload_sha256: str
    status: ReceiptStatus
    attempts: int
    event_ids: _containers.RepeatedScalarFieldContainer[int]
    error_class: str
    error_summary: str
    body: bytes
    origin: str
    def __init__(self, receipt_id: _Optional[int] = ..., namespace: _Optional[str] = ..., route_key: _Optional[str] = ..., provider_delivery_id: _Optional[str] = ..., method: _Optional[str] = ..., content_type: _Optional[str] = ..., event_kind: _Optional[str] = ..., received_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., accept_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., correlation_ids: _Optional[_Mapping[str, str]] = ..., payload_sha256: _Optional[str] = ..., status: _Optional[_Union[ReceiptStatus, str]] = ..., attempts: _Optional[int] = ..., event_ids: _Optional[_Iterable[int]] = ..., error_class: _Optional[str] = ..., error_summary: _Optional[str] = ..., body: _Optional[bytes] = ..., origin: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("event_id", "receipt_id", "installed_pack_id", "generation", "incarnation", "route_id", "route_version", "namespace", "event_kind", "source_object_kind", "source_object_id", "idempotency_key", "delivery_seq", "payload_sha256", "parse_outcome", "correlation_ids", "create_time")
    class CorrelationIdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ROUTE_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTE_VERSION_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    EVENT_KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OBJECT_KIND_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OBJECT_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_SEQ_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SHA256_FIELD_NUMBER: _ClassVar[int]
    PARSE_OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_IDS_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    receipt_id: int
    installed_pack_id: int
    generation: int
    incarnation: int
    route_id: int
    route_version: int
    namespace: str
    event_kind: str
    source_object_kind: str
    source_object_id: str
    idempotency_key: str
    delivery_seq: int
    payload_sha256: str
    parse_outcome: str
    correlation_ids: _containers.ScalarMap[str, str]
    create_time: _timestamp_pb2.Timestamp
    def __init__(self, event_id: _Optional[int] = ..., receipt_id: _Optional[int] = ..., installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., incarnation: _Optional[int] = ..., route_id: _Optional[int] = ..., route_version: _Optional[int] = ..., namespace: _Optional[str] = ..., event_kind: _Optional[str] = ..., source_object_kind: _Optional[str] = ..., source_object_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., delivery_seq: _Optional[int] = ..., payload_sha256: _Optional[str] = ..., parse_outcome: _Optional[str] = ..., correlation_ids: _Optional[_Mapping[str, str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WorkItem(_message.Message):
    __slots__ = ("work_id", "event_id", "installed_pack_id", "generation", "work_type", "queue_class", "state", "run_after", "priority", "attempts", "max_attempts", "delivery_seq", "source_lane_key", "target_mutation_lane_key", "lease_owner", "lease_token", "lease_until", "outcome", "failure_class", "failure_summary", "replay_count", "create_time", "update_time", "finish_time", "debounce_key", "covered_by")
    WORK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    INSTALLED_PACK_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    WORK_TYPE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_CLASS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RUN_AFTER_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_SEQ_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANE_KEY_FIELD_NUMBER: _ClassVar[int]
    TARGET_MUTATION_LANE_KEY_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    REPLAY_COUNT_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    DEBOUNCE_KEY_FIELD_NUMBER: _ClassVar[int]
    COVERED_BY_FIELD_NUMBER: _ClassVar[int]
    work_id: int
    event_id: int
    installed_pack_id: int
    generation: int
    work_type: str
    queue_class: str
    state: WorkItemState
    run_after: _timestamp_pb2.Timestamp
    priority: int
    attempts: int
    max_attempts: int
    delivery_seq: int
    source_lane_key: str
    target_mutation_lane_key: str
    lease_owner: str
    lease_token: int
    lease_until: _timestamp_pb2.Timestamp
    outcome: str
    failure_class: str
    failure_summary: str
    replay_count: int
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    debounce_key: str
    covered_by: int
    def __init__(self, work_id: _Optional[int] = ..., event_id: _Optional[int] = ..., installed_pack_id: _Optional[int] = ..., generation: _Optional[int] = ..., work_type: _Optional[str] = ..., queue_class: _Optional[str] = ..., state: _Optional[_Union[WorkItemState, str]] = ..., run_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority: _Optional[int] = ..., attempts: _Optional[int] = ..., max_attempts: _Optional[int] = ..., delivery_seq: _Optional[int] = ..., source_lane_key: _Optional[str] = ..., target_mutation_lane_key: _Optional[str] = ..., lease_owner: _Optional[str] = ..., lease_token: _Optional[int] = ..., lease_until: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., outcome: _Optional[str] = ..., failure_class: _Optional[str] = ..., failure_summary: _Optional[str] = ..., replay_count: _Optional[int] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., debounce_key: _Optional[str] = ..., covered_by: _Optional[int] = ...) -> None: ...

class RetryRequest(_message.Message):
    __slots__ = ("delay",)
    DELAY_FIELD_NUMBER: _ClassVar[int]
    delay: _duration_pb2.Duration
    def __init__(self, delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
