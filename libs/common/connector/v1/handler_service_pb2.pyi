import datetime

from connector.v1 import types_pb2 as _types_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HandleOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HANDLE_OUTCOME_UNSPECIFIED: _ClassVar[HandleOutcome]
    HANDLE_OUTCOME_SUCCESS: _ClassVar[HandleOutcome]
    HANDLE_OUTCOME_RETRY: _ClassVar[HandleOutcome]
    HANDLE_OUTCOME_PERMANENT_FAILURE: _ClassVar[HandleOutcome]
HANDLE_OUTCOME_UNSPECIFIED: HandleOutcome
HANDLE_OUTCOME_SUCCESS: HandleOutcome
HANDLE_OUTCOME_RETRY: HandleOutcome
HANDLE_OUTCOME_PERMANENT_FAILURE: HandleOutcome

class HandleRequest(_message.Message):
    __slots__ = ("work_item", "event", "payload", "content_type", "lease_token", "idempotency_key", "attempt", "coalesced_work_ids", "coalesced_event_ids")
    WORK_ITEM_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    LEASE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    COALESCED_WORK_IDS_FIELD_NUMBER: _ClassVar[int]
    COALESCED_EVENT_IDS_FIELD_NUMBER: _ClassVar[int]
    work_item: _types_pb2.WorkItem
    event: _types_pb2.Event
    payload: bytes
    content_type: str
    lease_token: int
    idempotency_key: str
    attempt: int
    coalesced_work_ids: _containers.RepeatedScalarFieldContainer[int]
    coalesced_event_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, work_item: _Optional[_Union[_types_pb2.WorkItem, _Mapping]] = ..., event: _Optional[_Union[_types_pb2.Event, _Mapping]] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., lease_token: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., attempt: _Optional[int] = ..., coalesced_work_ids: _Optional[_Iterable[int]] = ..., coalesced_event_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class HandleResponse(_message.Message):
    __slots__ = ("outcome", "retry_delay", "failure_class", "failure_summary")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    FAILURE_CLASS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_SUMMARY_FIELD_NUMBER: _ClassVar[int]
    outcome: HandleOutcome
    retry_delay: _duration_pb2.Duration
    failure_class: str
    failure_summary: str
    def __init__(self, outcome: _Optional[_Union[HandleOutcome, str]] = ..., retry_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., failure_class: _Optional[str] = ..., failure_summary: _Optional[str] = ...) -> None: ...
