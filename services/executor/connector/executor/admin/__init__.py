"""The admin gRPC API (connector.v1.AdminService), served by the executor process.

Mount it on any ``connector.common.core.grpc_server.GrpcServer``::

    from connector.executor.admin import PROTECTED_PREFIXES, build_admin, register, server_credentials

    admin = build_admin(pool, admin_settings)
    server = GrpcServer(host=..., port=..., authenticate=admin.authenticate,
                        protected_prefixes=PROTECTED_PREFIXES,
                        credentials=server_credentials(admin_settings))
    register(server, admin.servicer)

See docs/admin.md for RPCs, roles and error reasons.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from psycopg_pool import AsyncConnectionPool

from connector.common.core.settings import AdminSettings
from connector.executor.admin.auth import PROTECTED_PREFIXES, SERVICE, Principal, Role, TokenAuthenticator
from connector.executor.admin.auth import server_credentials as server_credentials
from connector.executor.admin.pagination import PageTokens
from connector.executor.admin.servicer import AdminServicer
from connector.v1 import admin_service_pb2_grpc

__all__ = [
    "PROTECTED_PREFIXES",
    "SERVICE",
    "AdminApi",
    "AdminServicer",
    "Principal",
    "Role",
    "TokenAuthenticator",
    "build_admin",
    "register",
    "server_credentials",
]


class AdminApi(NamedTuple):
    servicer: AdminServicer
    authenticate: TokenAuthenticator


def build_admin(pool: AsyncConnectionPool, settings: AdminSettings, **options: Any) -> AdminApi:
    """The servicer over ``pool`` and the auth hook for ``GrpcServer(authenticate=...)``.

    ``options`` tune the servicer (``replay_rate_default``, ``replay_rate_max``,
    ``replay_batch_size``, ``bulk_replay_concurrency``, ``process_stale_s``,
    ``process_heartbeat_s``). Raises ``SettingsError`` when ``CONNECTOR_ADMIN_TOKENS`` is malformed.
    """
    authenticate = TokenAuthenticator(settings.tokens.get_secret_value())
    options.setdefault("page_tokens", PageTokens.from_settings(settings))
    return AdminApi(AdminServicer(pool, **options), authenticate)


def register(server: Any, servicer: AdminServicer) -> None:
    """``server.add(add_AdminServiceServicer_to_server, servicer, "connector.v1.AdminService")``."""
    server.add(admin_service_pb2_grpc.add_AdminServiceServicer_to_server, servicer, SERVICE)
