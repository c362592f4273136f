import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitDeliveryRequest(_message.Message):
    __slots__ = ("namespace", "route_key", "method", "uri", "headers", "body", "receive_time")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ROUTE_KEY_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_TIME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    route_key: str
    method: str
    uri: str
    headers: _containers.ScalarMap[str, str]
    body: bytes
    receive_time: _timestamp_pb2.Timestamp
    def __init__(self, namespace: _Optional[str] = ..., route_key: _Optional[str] = ..., method: _Optional[str] = ..., uri: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., body: _Optional[bytes] = ..., receive_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SubmitDeliveryResponse(_message.Message):
    __slots__ = ("receipt_id", "duplicate", "http_status")
    RECEIPT_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    HTTP_STATUS_FIELD_NUMBER: _ClassVar[int]
    receipt_id: int
    duplicate: bool
    http_status: int
    def __init__(self, receipt_id: _Optional[int] = ..., duplicate: _Optional[bool] = ..., http_status: _Optional[int] = ...) -> None: ...
