"""Request checks at the gRPC boundary: once, for every RPC of every service, before its handler.

The server's interceptor (``connector.common.core.grpc_server``) runs ``check`` on every decoded request
and answers INVALID_ARGUMENT with an ``ErrorInfo`` reason (metadata ``field``: the field's path)
instead of letting client input reach the database or a conversion that raises:

* ``MALFORMED_REQUEST`` — the bytes are not a valid request message (bad UTF-8 in a string field,
  truncated or mistyped fields); the handler never runs;
* ``INVALID_STRING`` — a string (map keys and values, repeated items included) holds a NUL
  character, which PostgreSQL text cannot store and no identifier or filter of ours contains;
* ``STRING_TOO_LONG`` — longer than the service's limit for that field (``InputRules``);
* ``INVALID_TIMESTAMP`` — a ``google.protobuf.Timestamp`` outside 0001-01-01..9999-12-31 UTC or
  with nanos outside 0..999,999,999 (the range the Timestamp type defines), or a
  ``google.protobuf.Duration`` outside +-10,000 years.

Messages name the field and the rule, never the value (it may be a secret or a payload). A service
declares its limits as an ``input_rules`` attribute of its servicer (``GrpcServer.add`` reads it);
a servicer without one gets the defaults. Rules a field's meaning implies (positive ids, known enum
values, page tokens) stay with the handler that knows the meaning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

MALFORMED_REQUEST = "MALFORMED_REQUEST"
INVALID_STRING = "INVALID_STRING"
STRING_TOO_LONG = "STRING_TOO_LONG"
INVALID_TIMESTAMP = "INVALID_TIMESTAMP"

#: The range of google.protobuf.Timestamp: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999999Z.
TIMESTAMP_MIN_SECONDS = -62_135_596_800
TIMESTAMP_MAX_SECONDS = 253_402_300_799
#: The range of google.protobuf.Duration: about +-10,000 years.
DURATION_MAX_SECONDS = 315_576_000_000
NANOS_MAX = 999_999_999

_TIMESTAMP = "google.protobuf.Timestamp"
_DURATION = "google.protobuf.Duration"


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a servicer's constant
class InputRules:
    """Limits of one service's requests."""

    #: Longest string (in characters) any field may hold unless ``field_max_length`` says otherwise.
    max_length: int = 4096
    #: Per-field limits by field name (``manifest``) or full name (``connector.v1.X.manifest``).
    field_max_length: Mapping[str, int] = field(default_factory=dict)
    #: Added to every refusal's ErrorInfo metadata (e.g. the HTTP status a gateway should answer).
    error_metadata: Mapping[str, str] = field(default_factory=dict)
    #: Fields (by name) whose NUL characters the handler refuses itself, with its own reason (the
    #: ingress refuses control characters in header values as ``BAD_HEADER``, as over HTTP).
    nul_checked_by_handler: frozenset[str] = frozenset()

    def limit(self, fd: FieldDescriptor) -> int:
        limits = self.field_max_length
        return limits.get(fd.full_name, limits.get(fd.name, self.max_length))


DEFAULT_RULES = InputRules()


class InputError(ValueError):
    """A request that breaks a rule; the server answers INVALID_ARGUMENT with ``reason`` and
    ``metadata`` (``field`` plus the rules' ``error_metadata``) in its ErrorInfo."""

    def __init__(self, reason: str, message: str, metadata: Mapping[str, str]) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata = dict(metadata)


def refusal(reason: str, message: str, path: str, rules: InputRules = DEFAULT_RULES) -> InputError:
    return InputError(reason, message, {**rules.error_metadata, "field": path})


def malformed(type_name: str, rules: InputRules = DEFAULT_RULES) -> InputError:
    return InputError(
        MALFORMED_REQUEST,
        f"the request is not a valid {type_name} message (e.g. bad UTF-8 in a string field)",
        rules.error_metadata,
    )


def check(msg: Message, rules: InputRules = DEFAULT_RULES) -> None:
    """Raise ``InputError`` for the first field of ``msg`` that breaks a rule."""
    _message(msg, "", rules)


# What to check of each field, per (rules, message type): computed once, so a request costs one
# ListFields and a test per set field (a SubmitDelivery with a few headers: a few microseconds).
_SCALAR, _STRING, _STRINGS, _MESSAGE, _MESSAGES, _MAP = range(6)
_Plan = dict[str, tuple[int, int, bool, bool]]  # name -> (kind, limit, nul, map value is message)
_PLANS: dict[tuple[InputRules, str], _Plan] = {}


def _plan(rules: InputRules, descriptor: Any) -> _Plan:
    key = (rules, descriptor.full_name)
    plan = _PLANS.get(key)
    if plan is None:
        plan = {}
        for fd in descriptor.fields:
            limit, nul = rules.limit(fd), fd.name not in rules.nul_checked_by_handler
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                if fd.message_type.GetOptions().map_entry:
                    value_fd = fd.message_type.fields_by_name["value"]
                    plan[fd.name] = (_MAP, limit, nul, value_fd.type == FieldDescriptor.TYPE_MESSAGE)
                else:
                    plan[fd.name] = (_MESSAGES if fd.is_repeated else _MESSAGE, limit, nul, False)
            elif fd.type == FieldDescriptor.TYPE_STRING:
                plan[fd.name] = (_STRINGS if fd.is_repeated else _STRING, limit, nul, False)
            else:
                plan[fd.name] = (_SCALAR, limit, nul, False)
        _PLANS[key] = plan
    return plan


def _message(msg: Message, path: str, rules: InputRules) -> None:
    descriptor = msg.DESCRIPTOR
    name = descriptor.full_name
    if name == _TIMESTAMP:
        _timestamp(msg, path, rules)
        return
    if name == _DURATION:
        _duration(msg, path, rules)
        return
    plan = _plan(rules, descriptor)
    for fd, value in msg.ListFields():  # set fields only
        kind, limit, nul, map_of_messages = plan[fd.name]
        if kind == _STRING:
            if len(value) > limit or (nul and "\x00" in value):
                _string_refusal(value, _join(path, fd.name), limit, rules)
        elif kind == _STRINGS:
            for index, item in enumerate(value):
                if len(item) > limit or (nul and "\x00" in item):
                    _string_refusal(item, f"{_join(path, fd.name)}[{index}]", limit, rules)
        elif kind == _MAP:
            for key, item in value.items():
                if isinstance(key, str) and (len(key) > limit or (nul and "\x00" in key)):
                    _string_refusal(key, f"{_join(path, fd.name)} key", limit, rules)
                if map_of_messages:
                    _message(item, f"{_join(path, fd.name)} value", rules)
                elif isinstance(item, str) and (len(item) > limit or (nul and "\x00" in item)):
                    _string_refusal(item, f"{_join(path, fd.name)} value", limit, rules)
        elif kind == _MESSAGE:
            _message(value, _join(path, fd.name), rules)
        elif kind == _MESSAGES:
            for index, item in enumerate(value):
                _message(item, f"{_join(path, fd.name)}[{index}]", rules)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _string_refusal(value: str, path: str, limit: int, rules: InputRules) -> None:
    if len(value) > limit:
        raise refusal(STRING_TOO_LONG, f"{path} is longer than {limit} characters", path, rules)
    raise refusal(INVALID_STRING, f"{path} contains a NUL character", path, rules)


def _nanos_ok(nanos: int, *, signed: bool) -> bool:
    return (-NANOS_MAX if signed else 0) <= nanos <= NANOS_MAX


def _timestamp(msg: Any, path: str, rules: InputRules) -> None:
    if not (TIMESTAMP_MIN_SECONDS <= msg.seconds <= TIMESTAMP_MAX_SECONDS) or not _nanos_ok(
        msg.nanos, signed=False
    ):
        raise refusal(
            INVALID_TIMESTAMP,
            f"{path} is outside the Timestamp range (0001-01-01 to 9999-12-31 UTC, nanos 0..999999999)",
            path,
            rules,
        )


def _duration(msg: Any, path: str, rules: InputRules) -> None:
    seconds, nanos = msg.seconds, msg.nanos
    if (
        abs(seconds) > DURATION_MAX_SECONDS
        or not _nanos_ok(nanos, signed=True)
        or (seconds > 0 and nanos < 0)
        or (seconds < 0 and nanos > 0)
    ):
        raise refusal(INVALID_TIMESTAMP, f"{path} is outside the Duration range", path, rules)
