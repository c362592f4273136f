"""Proto contract rules (STYLE.md "Protos"), checked on the generated descriptors.

buf lint covers naming; these checks cover the API conventions buf cannot see: AIP-158 pagination on
List RPCs, AIP-155 ``request_id`` on retryable mutations, ``*_UNSPECIFIED`` zero values, and that every
service in ``protos/`` has generated Python (servicer base, registration function, stub).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
    MethodDescriptor,
    ServiceDescriptor,
)

ROOT = Path(__file__).resolve().parents[1]
PROTO_DIR = ROOT / "protos" / "connector" / "v1"
PROTO_FILES = sorted(p.stem for p in PROTO_DIR.glob("*.proto"))

# RPC name prefixes that only read. Every other RPC is a mutation and must carry request_id unless it
# is listed in MUTATION_EXEMPT with the reason it is idempotent by other means.
READ_PREFIXES = ("Get", "List", "BatchGet", "Watch", "Find", "Trace")
MUTATION_EXEMPT = {
    # Deduplicated by the delivery itself: (namespace, idempotency key derived by the route from the
    # provider's delivery id / body hash); a retried submit answers `duplicate = true`.
    "connector.v1.IngressService.SubmitDelivery",
    # Executor -> remote handler: idempotent on `idempotency_key` (from the delivery's identity) and fenced
    # by `lease_token`; a request_id would add nothing.
    "connector.v1.WorkHandlerService.Handle",
}


def _pb2(stem: str) -> ModuleType:
    return importlib.import_module(f"connector.v1.{stem}_pb2")


def _files() -> list[FileDescriptor]:
    return [_pb2(stem).DESCRIPTOR for stem in PROTO_FILES]


def _services() -> list[ServiceDescriptor]:
    return [svc for fd in _files() for svc in fd.services_by_name.values()]


def _methods() -> list[MethodDescriptor]:
    return [m for svc in _services() for m in svc.methods]


def _enums() -> Iterator[EnumDescriptor]:
    def nested(msg: Descriptor) -> Iterator[EnumDescriptor]:
        yield from msg.enum_types
        for inner in msg.nested_types:
            yield from nested(inner)

    for fd in _files():
        yield from fd.enum_types_by_name.values()
        for msg in fd.message_types_by_name.values():
            yield from nested(msg)


def _field(msg: Descriptor, name: str) -> FieldDescriptor | None:
    return msg.fields_by_name.get(name)


def _is_list(method: MethodDescriptor) -> bool:
    return method.name.startswith("List")


def _is_mutation(method: MethodDescriptor) -> bool:
    return not method.name.startswith(READ_PREFIXES)


def _ids(methods: list[MethodDescriptor]) -> list[str]:
    return [m.full_name for m in methods]


def test_every_proto_file_has_generated_code() -> None:
    assert PROTO_FILES, f"no .proto files under {PROTO_DIR}"
    for stem in PROTO_FILES:
        fd = _pb2(stem).DESCRIPTOR
        # Proto package path == Python import path (no import rewriting).
        assert fd.package == "connector.v1"
        assert fd.name == f"connector/v1/{stem}.proto"
        importlib.import_module(f"connector.v1.{stem}_pb2_grpc")


@pytest.mark.parametrize("service", _services(), ids=lambda s: s.full_name)
def test_every_service_has_servicer_base_and_stub(service: ServiceDescriptor) -> None:
    stem = Path(service.file.name).stem
    grpc_mod = importlib.import_module(f"connector.v1.{stem}_pb2_grpc")
    servicer = getattr(grpc_mod, f"{service.name}Servicer", None)
    assert servicer is not None, f"{grpc_mod.__name__} has no {service.name}Servicer"
    assert callable(getattr(grpc_mod, f"add_{service.name}Servicer_to_server", None))
    assert getattr(grpc_mod, f"{service.name}Stub", None) is not None
    for method in service.methods:
        assert callable(getattr(servicer, method.name, None)), f"{servicer.__name__}.{method.name} missing"


def test_services_exist() -> None:
    names = {s.full_name for s in _services()}
    assert {
        "connector.v1.AdminService",
        "connector.v1.IngressService",
        "connector.v1.WorkHandlerService",
    } <= names


@pytest.mark.parametrize("enum", list(_enums()), ids=lambda e: e.full_name)
def test_enum_zero_value_is_unspecified(enum: EnumDescriptor) -> None:
    first = enum.values[0]
    assert first.number == 0
    prefix = "".join("_" + c if c.isupper() else c.upper() for c in enum.name).lstrip("_")
    assert first.name == f"{prefix}_UNSPECIFIED", f"{enum.full_name}: zero value is {first.name}"
    for value in enum.values[1:]:
        assert value.number != 0


@pytest.mark.parametrize("method", _methods(), ids=lambda m: m.full_name)
def test_each_rpc_has_its_own_request_and_response(method: MethodDescriptor) -> None:
    assert method.input_type.name == f"{method.name}Request"
    assert method.output_type.name == f"{method.name}Response"


def test_list_rpcs_exist() -> None:
    # Guard against the parametrized checks below running over nothing.
    assert "connector.v1.AdminService.ListDeadLetters" in _ids([m for m in _methods() if _is_list(m)])


@pytest.mark.parametrize("method", [m for m in _methods() if _is_list(m)], ids=lambda m: m.full_name)
def test_list_rpcs_paginate(method: MethodDescriptor) -> None:
    """AIP-158: page_size (int32), opaque page_token (string) in, next_page_token (string) out."""
    page_size = _field(method.input_type, "page_size")
    page_token = _field(method.input_type, "page_token")
    next_token = _field(method.output_type, "next_page_token")
    assert page_size is not None and page_size.type == FieldDescriptor.TYPE_INT32
    assert page_token is not None and page_token.type == FieldDescriptor.TYPE_STRING
    assert next_token is not None and next_token.type == FieldDescriptor.TYPE_STRING
    assert not method.server_streaming, "a paginated list is unary"


def test_mutation_classification_is_not_vacuous() -> None:
    mutations = _ids([m for m in _methods() if _is_mutation(m)])
    assert "connector.v1.AdminService.ReplayWorkItem" in mutations
    assert "connector.v1.AdminService.GetWorkItem" not in mutations
    assert set(MUTATION_EXEMPT) <= set(_ids(_methods())), "stale exemption: the RPC no longer exists"


@pytest.mark.parametrize(
    "method",
    [m for m in _methods() if _is_mutation(m) and m.full_name not in MUTATION_EXEMPT],
    ids=lambda m: m.full_name,
)
def test_retryable_mutations_carry_request_id(method: MethodDescriptor) -> None:
    """AIP-155: a client may retry a mutation; the same request_id returns the first answer."""
    request_id = _field(method.input_type, "request_id")
    assert request_id is not None, f"{method.input_type.full_name} has no request_id"
    assert request_id.type == FieldDescriptor.TYPE_STRING
