#!/usr/bin/env python3
"""Container health probe (installed as ``connector-healthcheck`` in the image).

  connector-healthcheck http URL            healthy when GET URL answers 2xx
  connector-healthcheck grpc HOST:PORT [S]  healthy when grpc.health.v1 Check(S) is SERVING
                                            (S = service name, default "" = the whole server)
  connector-healthcheck auto                the probe that fits the container's command (PID 1's
                                            arguments): ingress -> http /readyz on
                                            CONNECTOR_INGRESS_HTTP_PORT; materializer, executor ->
                                            grpc on CONNECTOR_<SERVICE>_GRPC_PORT; anything else
                                            (db upgrade, admin ...) is healthy while it runs

Exit 0 when healthy, 1 otherwise; prints one line. Standard library + grpcio only, 2 s timeout.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT_S = 2.0
# The services' default ports (connector.common.core.settings; tests/test_deploy.py keeps them equal).
DEFAULT_PORTS = {"ingress": 8080, "materializer": 50052, "executor": 50053, "console": 8090}


def check_http(url: str) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 - probe of our own URL
            return 200 <= resp.status < 300, f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except OSError as exc:
        return False, type(exc).__name__


def check_grpc(target: str, service: str = "") -> tuple[bool, str]:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S
            )
        except grpc.RpcError as exc:
            return False, f"gRPC {exc.code().name}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, status


def auto_probe(cmdline: list[str], env: dict[str, str]) -> tuple[str, list[str]] | None:
    """The probe for a container whose PID 1 runs ``cmdline``: (kind, arguments), or None when the
    command is no long-running service."""
    service = next((arg for arg in cmdline[1:] if arg in DEFAULT_PORTS), None)
    if service is None:
        return None
    if service == "ingress":
        port = env.get("CONNECTOR_INGRESS_HTTP_PORT", str(DEFAULT_PORTS[service]))
        return "http", [f"http://127.0.0.1:{port}/readyz"]
    if service == "console":  # the operator console (docs/console.md); plain HTTP inside the pod
        port = env.get("CONNECTOR_CONSOLE_PORT", str(DEFAULT_PORTS[service]))
        return "http", [f"http://127.0.0.1:{port}/healthz"]
    port = env.get(f"CONNECTOR_{service.upper()}_GRPC_PORT", str(DEFAULT_PORTS[service]))
    return "grpc", [f"127.0.0.1:{port}"]


def _pid1_cmdline() -> list[str]:
    try:
        raw = Path("/proc/1/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def main(argv: list[str]) -> int:
    if argv == ["auto"]:
        probe = auto_probe(_pid1_cmdline(), dict(os.environ))
        if probe is None:
            print("healthy: no service probe for this command")
            return 0
        argv = [probe[0], *probe[1]]
    if len(argv) == 2 and argv[0] == "http":
        ok, detail = check_http(argv[1])
    elif len(argv) in (2, 3) and argv[0] == "grpc":
        ok, detail = check_grpc(*argv[1:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(("healthy: " if ok else "unhealthy: ") + detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
