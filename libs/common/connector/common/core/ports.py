"""A listener that cannot bind, told in one line that names the setting to change.

The services bind HTTP (aiohttp), gRPC and metrics listeners at start; a taken port surfaces as an
``OSError`` (``EADDRINUSE``) or, from gRPC, a ``RuntimeError("Failed to bind to address ...")``.
``bind_error_line`` recognises both and finds which ``CONNECTOR_*_PORT`` settings hold that port in
this environment, so the ``connector`` command prints that instead of a traceback.
"""

from __future__ import annotations

import errno
import re
import socket

from connector.common.core import settings

_GRPC_BIND = re.compile(r"Failed to bind to address (\S+?);?(?:\s|$)")
_PORT = re.compile(r"[:\s(,]\s*(\d{1,5})\)?$")


def _port_of(exc: BaseException) -> tuple[int, str] | None:
    """``(port, address)`` of a failed bind, or None when ``exc`` is not one."""
    if isinstance(exc, OSError) and exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
        # uvloop / asyncio: "error while attempting to bind on address ('127.0.0.1', 8080): ..."
        match = re.search(r"\('([^']*)', (\d+)\)", str(exc))
        if match:
            return int(match.group(2)), f"{match.group(1)}:{match.group(2)}"
        match = re.search(r"(\d{1,5})", str(exc))
        return (int(match.group(1)), match.group(1)) if match else (0, "")
    if isinstance(exc, RuntimeError):
        match = _GRPC_BIND.search(str(exc))
        if match:
            address = match.group(1)
            port = address.rsplit(":", 1)[-1]
            return (int(port), address) if port.isdigit() else (0, address)
    return None


def settings_with_port(port: int) -> list[str]:
    """The ``CONNECTOR_*`` variables whose value in this environment is ``port``."""
    found: list[str] = []
    for cls in (settings.IngressSettings, settings.MaterializerSettings, settings.ExecutorSettings):
        try:
            values = settings.load(cls)
        except SystemExit:
            continue
        prefix = str(cls.model_config.get("env_prefix", "")).upper()
        for name in type(values).model_fields:
            if name.endswith("_port") and getattr(values, name) == port:
                found.append(f"{prefix}{name.upper()}")
    return found


def bind_error_line(
    exc: BaseException, *, options: bool = False, names: list[str] | None = None
) -> str | None:
    """One line for a listener that could not bind (None: ``exc`` is something else); ``options``:
    the command also takes the port as ``--grpc-port`` etc. (the services do, ``up`` does not);
    ``names``: the settings of that listener when known (else those holding that port)."""
    seen = _port_of(exc)
    if seen is None:
        return None
    port, address = seen
    if isinstance(exc, OSError) and exc.errno == errno.EACCES:
        what = f"cannot listen on {address or port}: permission denied (ports below 1024 need root)"
    elif isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        what = f"cannot listen on {address}: no such address on this machine"
    else:
        what = f"port {port} ({address}): address already in use" if port else f"{address}: in use"
    names = names or (settings_with_port(port) if port else [])
    if names:
        flag = " (or --" + names[0].split("_", 2)[-1].lower().replace("_", "-") + ")" if options else ""
        todo = f"set {' or '.join(names)}{flag} to a free port (0 picks one), or stop what listens there"
    else:
        todo = "choose another port, or stop what listens there"
    return f"error: {what}: {todo}" + (f" (ss -ltnp 'sport = :{port}')" if port else "")


def taken_port_line(
    classes: tuple[type[settings.BaseSettings], ...], overrides: dict[str, object] | None = None
) -> str | None:
    """Before starting anything: one line for the first listener of ``classes`` (their ``*_port`` /
    ``*_host`` settings, or the command's ``--grpc-port``-style ``overrides`` by field name) whose
    port is taken, else None. A port that fills up later is still reported by ``bind_error_line``
    when the service binds."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    for cls in classes:
        values = settings.load(cls)
        for name in type(values).model_fields:
            if not name.endswith("_port"):
                continue
            port = int(given.get(name, getattr(values, name)))  # type: ignore[call-overload]
            host = str(
                given.get(name.removesuffix("_port") + "_host")
                or getattr(values, name.removesuffix("_port") + "_host", "127.0.0.1")
            )
            if port <= 0:
                continue
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((host, port))
                except OSError as exc:
                    shown = f"('{host}', {port})"
                    taken = OSError(exc.errno, f"bind on address {shown}: {exc.strerror}")
                    prefix = str(cls.model_config.get("env_prefix", "")).upper()
                    return bind_error_line(
                        taken, options=overrides is not None, names=[f"{prefix}{name.upper()}"]
                    )
    return None
