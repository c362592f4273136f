"""Access to the admin API: bearer tokens mapped to roles, checked on every RPC before it runs."""

from __future__ import annotations

import hmac
import logging
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from connector.common.core.settings import SettingsError
from connector.executor.admin import auth
from connector.executor.admin.auth import METHOD_ROLES, Role, TokenAuthenticator, parse_tokens
from connector.v1 import admin_service_pb2 as pb

from .conftest import ALL_TOKENS, OPERATOR, REPLAY, TOKENS, VIEW, VIEW_REPLAY, Admin, expect_error

SERVICE = pb.DESCRIPTOR.services_by_name["AdminService"]
METHODS = list(SERVICE.methods)


def _call(admin: Admin, method: Any, metadata: tuple[tuple[str, str], ...]) -> Any:
    request = getattr(pb, method.input_type.name)()
    return getattr(admin.stub, method.name)(request, metadata=metadata)


def test_every_rpc_has_a_role() -> None:
    assert {m.name for m in METHODS} == set(METHOD_ROLES)


async def test_every_rpc_rejects_a_missing_and_a_wrong_token(admin: Admin) -> None:
    assert len(METHODS) >= 12
    for method in METHODS:
        await expect_error(_call(admin, method, ()), grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")
        wrong = (("authorization", "Bearer not-a-configured-token-at-all"),)
        await expect_error(_call(admin, method, wrong), grpc.StatusCode.UNAUTHENTICATED, "TOKEN_INVALID")
        # A configured token under another scheme is not a bearer token.
        basic = (("authorization", f"Basic {OPERATOR}"),)
        await expect_error(_call(admin, method, basic), grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")
        # A prefix of a valid token is not valid.
        prefix = (("authorization", f"Bearer {OPERATOR[:-1]}"),)
        await expect_error(_call(admin, method, prefix), grpc.StatusCode.UNAUTHENTICATED, "TOKEN_INVALID")


async def test_every_rpc_needs_its_role(admin: Admin) -> None:
    roles_of = {VIEW: {Role.VIEW}, REPLAY: {Role.REPLAY}, VIEW_REPLAY: {Role.VIEW, Role.REPLAY}}
    for method in METHODS:
        required = METHOD_ROLES[method.name]
        if required is None:  # any valid token (GetCaller): test_get_caller_answers_every_token
            continue
        for token, roles in roles_of.items():
            if required in roles:
                continue
            exc = await expect_error(
                _call(admin, method, Admin.md(token)), grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED"
            )
            assert required.value in (exc.details() or "")


async def test_a_token_with_the_role_passes_authentication(admin: Admin) -> None:
    """Each RPC with a token holding its role (operator holds all) gets past auth: it may still fail
    on the empty request, but never with UNAUTHENTICATED or PERMISSION_DENIED."""
    for method in METHODS:
        for token in (
            OPERATOR,
            {Role.VIEW: VIEW, Role.REPLAY: REPLAY, Role.OPERATOR: OPERATOR, None: VIEW}[
                METHOD_ROLES[method.name]
            ],
        ):
            call = _call(admin, method, Admin.md(token))
            try:
                if hasattr(call, "__aiter__"):
                    async for _ in call:
                        pass
                else:
                    await call
            except grpc.aio.AioRpcError as exc:
                assert exc.code() not in (
                    grpc.StatusCode.UNAUTHENTICATED,
                    grpc.StatusCode.PERMISSION_DENIED,
                ), f"{method.name}: {exc.code()} {exc.details()}"


async def test_get_caller_answers_every_token(admin: Admin) -> None:
    """GetCaller needs no role: each token learns its key id, roles, the RPCs it may call (exactly
    those whose role it holds) and payload access; a wrong token is still refused."""
    for token, roles in (
        (VIEW, {Role.VIEW}),
        (REPLAY, {Role.REPLAY}),
        (VIEW_REPLAY, {Role.VIEW, Role.REPLAY}),
        (OPERATOR, {Role.OPERATOR}),
    ):
        me = await admin.stub.GetCaller(pb.GetCallerRequest(), metadata=Admin.md(token))
        assert me.key_id == auth.key_id(token) and token not in str(me)
        assert set(me.roles) == {r.value for r in roles}
        expected = sorted(
            m for m, r in METHOD_ROLES.items() if r is None or Role.OPERATOR in roles or r in roles
        )
        assert list(me.allowed_methods) == expected
        assert ("PausePack" in me.allowed_methods) == (Role.OPERATOR in roles)
        assert ("ReplayWorkItem" in me.allowed_methods) == bool(roles & {Role.REPLAY, Role.OPERATOR})
        assert me.may_see_payload == bool(roles & {Role.REPLAY, Role.OPERATOR})
    await expect_error(
        admin.stub.GetCaller(pb.GetCallerRequest(), metadata=Admin.md("not-a-configured-token-at-all")),
        grpc.StatusCode.UNAUTHENTICATED,
        "TOKEN_INVALID",
    )


async def test_health_is_not_protected(admin: Admin) -> None:
    response = await health_pb2_grpc.HealthStub(admin.channel).Check(
        health_pb2.HealthCheckRequest(service="connector.v1.AdminService")
    )
    assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_tokens_never_reach_the_logs(admin: Admin, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for token in (*ALL_TOKENS, "wrong-token-0123456789abcdef"):
        try:
            await admin.stub.GetQueueStats(pb.GetQueueStatsRequest(), metadata=Admin.md(token))
        except grpc.aio.AioRpcError:
            pass
    await expect_error(
        admin.stub.ReplayWorkItem(pb.ReplayWorkItemRequest(work_id=1), metadata=Admin.md(REPLAY)),
        grpc.StatusCode.NOT_FOUND,
    )
    assert caplog.records, "nothing logged at all: the check below would be vacuous"
    dumped = "\n".join(str(vars(r)) for r in caplog.records)
    for token in (*ALL_TOKENS, "wrong-token-0123456789abcdef"):
        assert token not in dumped


# --- the token table ---------------------------------------------------------------------------


def test_parse_tokens_maps_roles_and_key_ids() -> None:
    table = parse_tokens(TOKENS)
    assert len(table) == 4
    roles = {p.key_id: p.roles for _, p in table}
    assert roles[auth.key_id(VIEW_REPLAY)] == {Role.VIEW, Role.REPLAY}
    operator = next(p for _, p in table if p.key_id == auth.key_id(OPERATOR))
    assert operator.has(Role.VIEW) and operator.has(Role.REPLAY) and operator.may_see_payload
    view = next(p for _, p in table if p.key_id == auth.key_id(VIEW))
    assert not view.has(Role.REPLAY) and not view.may_see_payload


def test_parse_tokens_accepts_base64_padding_in_tokens() -> None:
    (entry,) = parse_tokens("YWJjZGVmZ2hpamtsbW5vcA===ViewConnectorEvents")
    assert entry[1].key_id == auth.key_id("YWJjZGVmZ2hpamtsbW5vcA==")


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("short=ViewConnectorEvents", "shorter than"),
        ("0123456789abcdefXYZ=Admin", "unknown role 'Admin'"),
        ("0123456789abcdefXYZ", "expected token=Role"),
        ("0123456789abcdefXYZ=ViewConnectorEvents;0123456789abcdefXYZ=ConnectorOperator", "duplicate"),
    ],
)
def test_parse_tokens_rejects_bad_entries_without_echoing_tokens(spec: str, problem: str) -> None:
    with pytest.raises(SettingsError) as err:
        parse_tokens(spec)
    assert problem in str(err.value)
    assert "0123456789abcdefXYZ" not in str(err.value)


async def test_every_configured_token_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: the presented token is compared with all entries, matching or not."""
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    authenticate = TokenAuthenticator(TOKENS)
    await authenticate("/connector.v1.AdminService/GetQueueStats", (("authorization", f"Bearer {VIEW}"),))
    assert len(calls) == 4
    calls.clear()
    with pytest.raises(Exception, match="invalid token"):
        await authenticate("/connector.v1.AdminService/GetQueueStats", (("authorization", "Bearer nope"),))
    assert len(calls) == 4


async def test_no_tokens_configured_refuses_everything() -> None:
    authenticate = TokenAuthenticator("")
    with pytest.raises(Exception, match="invalid token"):
        await authenticate("/connector.v1.AdminService/GetQueueStats", (("authorization", f"Bearer {VIEW}"),))


async def test_an_rpc_missing_from_the_role_map_is_refused() -> None:
    authenticate = TokenAuthenticator(TOKENS)
    with pytest.raises(Exception, match="needs role none"):
        await authenticate(
            "/connector.v1.AdminService/DropEverything", (("authorization", f"Bearer {OPERATOR}"),)
        )
